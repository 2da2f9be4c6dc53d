"""Whom a storage client or node sends its token to (issue 48 point 2): only storage nodes that
a service credential registered with mgmtd (they have an owner in routing)."""

from __future__ import annotations

import pytest

from fireflyer.mgmt.model import NodeInfo, NodeType, RoutingInfo, TargetInfo
from fireflyer.storage import NotServing
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.protocol import trusted_peer, wire_tag


def _node(node_id: str, type_: NodeType = NodeType.STORAGE, owner: str = "svc-storage") -> NodeInfo:
    return NodeInfo(node_id=node_id, type=type_, address="127.0.0.1:1", tags=(wire_tag("127.0.0.1:2"),), owner=owner)


def test_only_storage_nodes_registered_by_a_service_are_trusted() -> None:
    assert trusted_peer(_node("s1"))
    assert not trusted_peer(_node("s1", owner=""))  # stored before owners existed: not until it heartbeats
    assert not trusted_peer(_node("m1", NodeType.META, owner="svc-meta"))  # another kind of node


def test_the_client_has_no_address_for_a_target_on_an_untrusted_node() -> None:
    routing = RoutingInfo(version=1, nodes=(_node("s1"), _node("s2", owner="")),
                          targets=(TargetInfo(target_id=1, node_id="s1", chain_id=1),
                                   TargetInfo(target_id=2, node_id="s2", chain_id=1)))
    client = StorageClient(lambda: routing, token="fft_user")
    try:
        assert client.address(1) == ("s1", "127.0.0.1:2")
        with pytest.raises(NotServing, match="registered by a service"):
            client.address(2)
    finally:
        client.close()

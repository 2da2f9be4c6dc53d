"""Generated protobuf and gRPC code, one package per proto: ``fireflyer.api.<svc>.v1``.

Sources live in ``proto/fireflyer/api/<svc>/v1/*.proto``; ``make proto``
(``python -m fireflyer.api.build``) regenerates this tree, and a unit test fails
when the committed code is stale.  Only this file and ``build.py`` are written
by hand.  Generated ``*_pb2`` types stay at the edge (``fireflyer.rpc``, clients,
servicers); domain code works with msgspec Structs.
"""

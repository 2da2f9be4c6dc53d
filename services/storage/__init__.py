"""The 3FS storage service: CRAQ targets served over the ``fireflyer.wire`` data plane.

See ``app`` (settings, wiring), ``node`` (targets, routing view, fencing), ``dataplane``
(the ``stor.*`` handler), ``forwarder`` (calls to other storage nodes), ``loops`` (join,
heartbeat, resync, corruption repair, chain bootstrap).  The protocol itself is
:mod:`fireflyer.storage.protocol`; a minimal client is :mod:`fireflyer.storage.client_min`.
"""

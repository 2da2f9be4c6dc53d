"""Benchmarks: one module per ``ff bench`` verb, each with ``main(argv) -> int``.

The harnesses import the libraries they measure (``fireflyer.hfreduce``, ``fireflyer.fs``,
``fireflyer.ckpt``, ...); no domain package imports this one.  Private helpers shared by
several verbs are the ``_name`` modules (the floor and ring anchors, the goals, the
``--runs`` folding, the rank process of ``ff bench allreduce``, ``--json`` output).
"""

"""The checkpoint service: the catalog of checkpoints over the KV and 3FS (see app.py)."""

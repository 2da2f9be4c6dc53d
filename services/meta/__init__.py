"""The 3FS metadata service: ``python -m services.meta`` (see ``app`` and ``servicer``)."""

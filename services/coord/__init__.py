"""The collective coordination service (``python -m services.coord``)."""

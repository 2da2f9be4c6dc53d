"""The node agent (one per machine)."""

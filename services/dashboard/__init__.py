"""The web dashboard (docs/dashboard.md)."""

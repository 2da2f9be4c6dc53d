"""The health service: node health states, validation scheduling, incidents (docs/health.md)."""

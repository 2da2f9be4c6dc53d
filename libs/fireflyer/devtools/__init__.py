"""Developer tooling used by the Makefile (import rules, ...)."""

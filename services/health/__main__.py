"""``python -m services.health``: run the health service."""

from services.health.app import main

if __name__ == "__main__":
    raise SystemExit(main())

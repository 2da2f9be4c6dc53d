"""``python -m services.coord``: run the coordination service."""

from services.coord.app import main

if __name__ == "__main__":
    raise SystemExit(main())

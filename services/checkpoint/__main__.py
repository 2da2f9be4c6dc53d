"""``python -m services.checkpoint``: run the checkpoint service."""

from services.checkpoint.app import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m services.storage``: run one storage node."""

from services.storage.app import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m services.scheduler``: run one scheduler replica."""

from services.scheduler.app import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m services.mgmtd``: run one mgmtd replica."""

from services.mgmtd.app import main

if __name__ == "__main__":
    raise SystemExit(main())

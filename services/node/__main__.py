"""``python -m services.node``: run the node agent."""

from services.node.app import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m services.meta``: run one meta replica (settings: FF_META_*, see app.py)."""

from __future__ import annotations

from fireflyer.core.runtime import run_service

from .app import MetaService


def main(argv: list[str] | None = None) -> int:
    return run_service(MetaService, argv)


if __name__ == "__main__":
    raise SystemExit(main())

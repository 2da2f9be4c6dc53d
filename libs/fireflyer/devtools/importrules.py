"""Check the import rules of DESIGN.md §2 by reading the source (no imports run).

- ``libs`` (the ``fireflyer`` package) never imports ``services``;
- ``services.<a>`` never imports ``services.<b>``.

Relative imports are resolved, so ``from ..other import x`` inside a service
counts as an import of ``services.other``.

``python -m fireflyer.devtools.importrules libs services`` prints one line per
violation (file:line: rule) and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Violation", "check_file", "check_tree", "main"]


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.imported}: {self.rule}"


def _imports(tree: ast.AST, module: str) -> Iterator[tuple[int, str]]:
    pkg = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for a in node.names:
                yield node.lineno, f"{target}.{a.name}"


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts and parts[0] == "libs":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def check_source(source: str, module: str, display: str) -> list[Violation]:
    out: list[Violation] = []
    tree = ast.parse(source, filename=display)
    top = module.split(".")[0]
    own_service = module.split(".")[1] if top == "services" and "." in module else None
    seen: set[int] = set()
    for line, imported in _imports(tree, module):
        if line in seen:
            continue  # one report per import statement
        parts = imported.split(".")
        if top == "fireflyer" and parts[0] == "services":
            out.append(Violation(display, line, imported, "libs must not import services"))
            seen.add(line)
        elif top == "services" and parts[0] == "services" and len(parts) > 1 and parts[1] != own_service:
            out.append(Violation(display, line, imported, "a service must not import another service"))
            seen.add(line)
    return out


def check_file(path: Path, root: Path) -> list[Violation]:
    return check_source(path.read_text(), module_name(path, root), str(path.relative_to(root)))


def check_tree(root: Path, dirs: list[str]) -> list[Violation]:
    out: list[Violation] = []
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            if "/api/" in path.as_posix() and path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            out.extend(check_file(path, root))
    return out


def main(argv: list[str] | None = None) -> int:
    dirs = (argv if argv is not None else sys.argv[1:]) or ["libs", "services"]
    violations = check_tree(Path.cwd(), dirs)
    for v in violations:
        print(v)
    print(f"import rules: {len(violations)} violation(s) in {', '.join(dirs)}")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())

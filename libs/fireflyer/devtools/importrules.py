"""Check the import rules of DESIGN.md §2 by reading the source (no imports run).

- ``libs`` (the ``fireflyer`` package) never imports ``services``;
- ``services.<a>`` never imports ``services.<b>``;
- benchmarks live in ``fireflyer.bench``: no module elsewhere is named ``bench*`` or
  ``_bench*``, and nothing but ``fireflyer.bench`` (and ``fireflyer.cli``, which runs the
  verbs) imports ``fireflyer.bench``;
- the modules of one package import each other without a cycle, so a package reads
  top-down.  Imports inside functions count; imports under ``if TYPE_CHECKING:`` do not
  (they never run).  Each cycle (a strongly connected set of modules) is reported once,
  with its modules and one loop through them.

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

__all__ = ["Violation", "check_file", "check_source", "check_tree", "find_cycles", "main"]


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        if not self.imported:  # a rule about the module itself (its name), not one of its imports
            return f"{self.path}:{self.line}: {self.rule}"
        return f"{self.path}:{self.line}: imports {self.imported}: {self.rule}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(tree: ast.AST, skip_type_checking: bool) -> Iterator[ast.AST]:
    """ast.walk, leaving out the bodies of ``if TYPE_CHECKING:`` when asked."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if skip_type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            todo.append(node.test)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.AST, module: str, *, is_package: bool = False,
             skip_type_checking: bool = False) -> Iterator[tuple[int, str]]:
    pkg = module if is_package else module.rsplit(".", 1)[0]
    for node in _walk(tree, skip_type_checking):
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


BENCH_PACKAGE = "fireflyer.bench"
#: packages that may import the benchmarks: the benchmarks themselves and the CLI that runs them
_BENCH_IMPORTERS = (BENCH_PACKAGE, "fireflyer.cli")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def check_source(source: str, module: str, display: str, *, is_package: bool | None = None) -> list[Violation]:
    out: list[Violation] = []
    tree = ast.parse(source, filename=display)
    top = module.split(".")[0]
    own_service = module.split(".")[1] if top == "services" and "." in module else None
    if is_package is None:
        is_package = Path(display).name == "__init__.py"
    name = module.rsplit(".", 1)[-1]
    if name.startswith(("bench", "_bench")) and not _within(module, BENCH_PACKAGE) and top in ("fireflyer", "services"):
        out.append(Violation(display, 1, "", f"{module} is a benchmark: it belongs in {BENCH_PACKAGE} "
                                             "(one module per ff bench verb), not in a domain package"))
    may_import_bench = any(_within(module, p) for p in _BENCH_IMPORTERS)
    seen: set[int] = set()
    for line, imported in _imports(tree, module, is_package=is_package):
        if line in seen:
            continue  # one report per import statement
        parts = imported.split(".")
        if top == "fireflyer" and parts[0] == "services":
            out.append(Violation(display, line, imported, "libs must not import services"))
            seen.add(line)
        elif top == "services" and parts[0] == "services" and len(parts) > 1 and parts[1] != own_service:
            out.append(Violation(display, line, imported, "a service must not import another service"))
            seen.add(line)
        elif not may_import_bench and _within(imported, BENCH_PACKAGE):
            out.append(Violation(display, line, imported, f"only {BENCH_PACKAGE} and fireflyer.cli may import "
                                                          f"{BENCH_PACKAGE} (a library must not depend on a benchmark)"))
            seen.add(line)
    return out


@dataclass(frozen=True)
class _Module:
    name: str
    display: str
    tree: ast.AST
    is_package: bool


def _graph(mods: dict[str, _Module]) -> dict[str, dict[str, int]]:
    """module -> {sibling module it imports: line of the first such import}, run-time imports only."""
    plain = {m for m, info in mods.items() if not info.is_package}
    graph: dict[str, dict[str, int]] = {}
    for m in sorted(plain):
        info = mods[m]
        pkg = m.rsplit(".", 1)[0]
        edges: dict[str, int] = {}
        for line, imported in _imports(info.tree, m, skip_type_checking=True):
            parts = imported.split(".")
            for n in range(len(parts), 0, -1):  # the longest prefix that is a module of the tree
                cand = ".".join(parts[:n])
                if cand in plain:
                    if cand != m and cand.rsplit(".", 1)[0] == pkg:
                        edges.setdefault(cand, line)
                    break
        graph[m] = edges
    return graph


def _sccs(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _loop(graph: dict[str, dict[str, int]], comp: list[str]) -> list[str]:
    """One cycle through ``comp[0]`` inside the component (shortest, by breadth-first search)."""
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def find_cycles(mods: dict[str, _Module]) -> list[Violation]:
    graph = _graph(mods)
    out = []
    for comp in _sccs(graph):
        loop = _loop(graph, comp)
        first = mods[loop[0]]
        short = [m.rsplit(".", 1)[1] for m in loop]
        names = ", ".join(m.rsplit(".", 1)[1] for m in comp)
        out.append(Violation(first.display, graph[loop[0]][loop[1]], loop[1],
                             f"import cycle in {loop[0].rsplit('.', 1)[0]} among {names} "
                             f"({' -> '.join(short)}); move what they share into a lower module, "
                             "or import for annotations only under TYPE_CHECKING"))
    return out


def check_file(path: Path, root: Path) -> list[Violation]:
    return check_source(path.read_text(), module_name(path, root), str(path.relative_to(root)),
                        is_package=path.name == "__init__.py")


def check_tree(root: Path, dirs: list[str]) -> list[Violation]:
    """Every rule over the ``.py`` files under ``root/<dir>`` (generated protobuf modules left out)."""
    out: list[Violation] = []
    mods: dict[str, _Module] = {}
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            if "/api/" in path.as_posix() and path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            display = str(path.relative_to(root))
            name = module_name(path, root)
            source = path.read_text()
            out.extend(check_source(source, name, display, is_package=path.name == "__init__.py"))
            mods[name] = _Module(name, display, ast.parse(source, filename=display), path.name == "__init__.py")
    out.extend(find_cycles(mods))
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

"""Offline checks of the deployment files (``compose.yaml``, ``deploy/k8s/``): no container engine,
no cluster, only what the code itself says.

    doc = resolve_compose(yaml.safe_load(text), env={})     # ${VAR:-default} -> default
    names = env_names_read(root)                             # every FF_* name the code reads
    cls = settings_class("services.meta")                    # the settings its process loads

The deployment files name modules (a container's ``python -m <module>``) and set environment
variables; both drift silently when code is renamed, because a container that is never started
never fails.  These helpers answer, from the source tree alone, whether a module exists, which
settings class its process builds from the environment, and which variable names any code reads,
so a test can hold every deployment file to the code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import InvalidArgument
from fireflyer.core.settings import env_name

__all__ = [
    "interpolate",
    "resolve_compose",
    "env_literals",
    "settings_env_names",
    "env_names_read",
    "settings_class",
    "module_exists",
    "python_module_of",
]

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, $VAR and $$ (a literal $), as
# compose interpolates them before it reads the file
_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """``value`` with compose's variable syntax substituted from ``env``; a required variable
    (``${VAR:?message}``) that is unset is an :class:`InvalidArgument`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4) or ""
        val = env.get(name)
        unset = val is None or (op is not None and op.startswith(":") and val == "")
        if op in (":-", "-"):
            return arg if unset else str(val)
        if op in (":?", "?"):
            if unset:
                raise InvalidArgument(f"variable {name} is required: {arg}", variable=name)
            return str(val)
        return "" if val is None else str(val)

    return _VAR.sub(sub, value)


def resolve_compose(node: Any, env: Mapping[str, str]) -> Any:
    """A loaded compose document with every string interpolated (keys stay as written)."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: resolve_compose(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_compose(v, env) for v in node]
    return node


def env_literals(paths: Iterable[Path]) -> set[str]:
    """Upper-case names that appear as a whole string literal in the Python files under
    ``paths`` (``os.environ.get("FF_SCHED_ADDR")``, ``ADDR_ENV = {"meta": "FF_META_ADDR"}``).

    Only whole literals count: a docstring or comment that mentions a name is not code that
    reads it, and neither is a prefix such as ``"FF_AGENT_"``."""
    out: set[str] = set()
    for root in paths:
        for f in sorted(root.rglob("*.py")):
            tree = ast.parse(f.read_text(), filename=str(f))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.match(node.value):
                    out.add(node.value)
    return out


def _leaf_paths(cls: type[msgspec.Struct], path: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    import typing

    hints = typing.get_type_hints(cls)
    for f in msgspec.structs.fields(cls):
        tp = hints.get(f.name, f.type)
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            yield from _leaf_paths(tp, (*path, f.name))
        else:
            yield (*path, f.name)


def settings_env_names(cls: type[msgspec.Struct]) -> set[str]:
    """The ``FF_*`` names the settings loader reads for ``cls`` (fireflyer.core.settings)."""
    return {env_name(p) for p in _leaf_paths(cls)}


def python_module_of(command: list[str] | str | None) -> str | None:
    """``["python", "-m", "services.meta"]`` -> ``"services.meta"``; None for another command."""
    if not isinstance(command, list):
        return None
    for i, word in enumerate(command[:-1]):
        if word == "-m" and Path(command[0]).name.startswith("python"):
            return command[i + 1]
    return None


def module_exists(module: str) -> bool:
    """Whether ``python -m module`` finds something to run (a package needs ``__main__``)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return True


def settings_class(module: str) -> type[ServiceSettings]:
    """The settings class the process ``python -m module`` loads: that of the one
    :class:`~fireflyer.core.runtime.Service` defined in the module (or its ``app`` submodule,
    the layout of ``services/*``)."""
    from fireflyer.core.runtime import Service

    candidates = [module]
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:
        candidates.insert(0, f"{module}.app")
    for name in candidates:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        found = [obj for _, obj in inspect.getmembers(mod, inspect.isclass)
                 if issubclass(obj, Service) and obj is not Service and obj.__module__ == mod.__name__]
        if len(found) == 1:
            return found[0].settings_type
        if len(found) > 1:
            raise InvalidArgument(f"{name} defines several services: {[c.__name__ for c in found]}", module=name)
    raise InvalidArgument(f"no Service class in {module} (or {module}.app)", module=module)


def env_names_read(root: Path) -> set[str]:
    """Every environment name the code under ``root`` reads: whole string literals in ``libs/``
    and ``services/`` plus the ``FF_*`` name of every settings field of every service's settings
    class (``services/<name>`` and the diagnostic echo service)."""
    names = env_literals([root / "libs", root / "services"])
    modules = ["fireflyer.testing.echo"] + [
        f"services.{d.name}" for d in sorted((root / "services").iterdir()) if (d / "__main__.py").exists()]
    for m in modules:
        names |= settings_env_names(settings_class(m))
    return names

"""A task spec from a file shaped like HAI's v2 experiment file, in YAML (as HAI writes it), TOML or JSON.

The suffix picks the parser: ``.yaml``/``.yml`` (``yaml.safe_load``: plain data only, no tags that
build objects), ``.json``, anything else TOML.  The structure, in YAML::

    name: llama-13b
    priority: HIGH                    # a HAI level or its number
    spec:
      entrypoint: train.py            # .py runs with python, .sh with bash, else as a program
      parameters: --lr 3e-4 --bs 8    # a string (split like a shell) or a list
      entrypoint_executable: false    # true: run entrypoint itself even if it ends in .py/.sh
    resource:
      group: default                  # the node group
      node_count: 4
      zone: ""                        # ours: pin to one network zone
    options:                          # ours beside HAI's whole_life_state and watchdog_time
      whole_life_state: 0
      watchdog_time: 1800

and the same in TOML::

    name = "llama-13b"
    priority = "HIGH"                 # a HAI level or its number

    [spec]
    entrypoint = "train.py"           # .py runs with python, .sh with bash, else as a program
    parameters = "--lr 3e-4 --bs 8"   # a string (split like a shell) or a list
    entrypoint_executable = false     # true: run entrypoint itself even if it ends in .py/.sh

    [resource]
    group = "default"                 # the node group
    node_count = 4
    zone = ""                         # ours: pin to one network zone

    [options]                         # ours beside HAI's whole_life_state and watchdog_time
    whole_life_state = 0
    watchdog_time = 1800
    max_restarts = 0
    grace_ack_s = 5.0
    grace_final_s = 5.0
    signal = "SIGUSR1"

:func:`read_spec_file` returns the fields of :class:`fireflyer.sched.model.TaskSpec` it names (the
CLI's flags override them).  HAI fields we do not implement (``image``, ``workspace``,
``environments``, ``py_venv``, ...) are refused by name rather than silently ignored.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

from fireflyer.core.errors import InvalidArgument

__all__ = ["read_spec_file", "spec_fields"]

_SECTIONS = {"name", "priority", "spec", "resource", "options"}
_SPEC = {"entrypoint", "parameters", "entrypoint_executable"}
_RESOURCE = {"group", "node_count", "zone"}
_OPTIONS = {"whole_life_state", "watchdog_time", "max_restarts", "grace_ack_s", "grace_final_s", "signal",
            "task_type", "min_runtime_s"}


def read_spec_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InvalidArgument(f"cannot read task spec file {p}: {e.strerror}", field="file", path=str(p)) from None
    if p.suffix in (".yaml", ".yml"):
        data = _load_yaml(text, p)
    else:
        try:
            data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            kind = "JSON" if p.suffix == ".json" else "TOML"
            raise InvalidArgument(f"task spec file {p} is not valid {kind}: {e}", field="file",
                                  path=str(p)) from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"task spec file {p} must hold a mapping (name, priority, spec, resource, options), "
                              f"not {type(data).__name__}", field="file", path=str(p))
    return spec_fields(data, source=str(p))


def _load_yaml(text: str, p: Path) -> Any:
    import yaml  # only a YAML spec pays for the import

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e)
        raise InvalidArgument(f"task spec file {where} is not valid YAML: {problem}", field="file", path=str(p),
                              line=mark.line + 1 if mark is not None else 0) from None


def _section(data: dict[str, Any], name: str, allowed: set[str], source: str) -> dict[str, Any]:
    sec = data.get(name, {})
    if sec is None:  # YAML's "options:" with nothing under it
        sec = {}
    if not isinstance(sec, dict):
        raise InvalidArgument(f"{source}: [{name}] must be a table", field=name)
    extra = set(sec) - allowed
    if extra:
        raise InvalidArgument(f"{source}: {name}.{sorted(extra)[0]} is not supported here (supported: "
                              f"{', '.join(sorted(allowed))})", field=f"{name}.{sorted(extra)[0]}")
    return sec


def spec_fields(data: dict[str, Any], *, source: str = "spec") -> dict[str, Any]:
    """The TaskSpec fields of a parsed v2 experiment mapping (module doc)."""
    extra = set(data) - _SECTIONS
    if extra:
        raise InvalidArgument(f"{source}: {sorted(extra)[0]} is not supported here (supported: "
                              f"{', '.join(sorted(_SECTIONS))})", field=sorted(extra)[0])
    spec = _section(data, "spec", _SPEC, source)
    resource = _section(data, "resource", _RESOURCE, source)
    options = _section(data, "options", _OPTIONS, source)
    out: dict[str, Any] = {}
    if "name" in data:
        out["name"] = str(data["name"])
    if "priority" in data:
        out["priority"] = str(data["priority"])
    if "entrypoint" in spec:
        entry = str(spec["entrypoint"])
        params = spec.get("parameters", [])
        args = shlex.split(params) if isinstance(params, str) else [str(a) for a in params]
        if spec.get("entrypoint_executable") or not entry.endswith((".py", ".sh")):
            out["command"] = [entry, *args]
        else:
            out["command"] = ["python" if entry.endswith(".py") else "bash", entry, *args]
    if "group" in resource:
        out["group"] = str(resource["group"])
    if "node_count" in resource:
        out["nodes"] = resource["node_count"]
    if "zone" in resource:
        out["zone"] = str(resource["zone"])
    rename = {"watchdog_time": "watchdog_s"}
    for key, value in options.items():
        out[rename.get(key, key)] = value
    return out

from pathlib import Path

from fireflyer.devtools.importrules import check_source, check_tree


def test_libs_importing_services_is_a_violation():
    v = check_source("import services.mgmtd\n", "fireflyer.kv.store", "libs/fireflyer/kv/store.py")
    assert [x.rule for x in v] == ["libs must not import services"]
    v = check_source("from services.meta.app import X\n", "fireflyer.kv", "libs/fireflyer/kv/__init__.py")
    assert v and v[0].line == 1


def test_service_importing_another_service_is_a_violation():
    v = check_source("from services.meta import inode\n", "services.mgmtd.app", "services/mgmtd/app.py")
    assert [x.rule for x in v] == ["a service must not import another service"]


def test_relative_import_into_a_sibling_service_is_caught():
    v = check_source("from ..meta import inode\n", "services.mgmtd.app", "services/mgmtd/app.py")
    assert v and v[0].imported.startswith("services.meta")


def test_allowed_imports_pass():
    src = "import fireflyer.core\nfrom services.mgmtd import state\nfrom . import state\n"
    assert check_source(src, "services.mgmtd.app", "services/mgmtd/app.py") == []
    assert check_source("from fireflyer.rpc import RpcServer\n", "fireflyer.bus.x", "x.py") == []


def test_the_repository_obeys_the_rules():
    root = Path(__file__).resolve().parents[3]
    assert check_tree(root, ["libs", "services"]) == []


# -- cycles inside a package, and benchmarks outside fireflyer.bench -----------------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "libs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _rules(violations: list) -> list[str]:
    return [v.rule.split(" (")[0] for v in violations]


def test_a_cycle_between_modules_of_one_package_fails_once_naming_its_modules(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "fireflyer/__init__.py": "",
        "fireflyer/pkg/__init__.py": "from .a import A\n",
        "fireflyer/pkg/a.py": "from .b import B\nA = 1\n",
        "fireflyer/pkg/b.py": "def f():\n    from fireflyer.pkg import c  # inside a function: still runs\n",
        "fireflyer/pkg/c.py": "import fireflyer.pkg.a\n",
        "fireflyer/pkg/d.py": "from . import a\n",  # imports into the cycle, not part of it
    })
    v = check_tree(tmp_path, ["libs"])
    assert len(v) == 1, v
    assert "import cycle in fireflyer.pkg among a, b, c" in v[0].rule
    assert "(a -> b -> c -> a)" in v[0].rule
    assert v[0].path == "libs/fireflyer/pkg/a.py" and v[0].line == 1 and v[0].imported == "fireflyer.pkg.b"


def test_two_cycles_are_two_violations(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "fireflyer/p/x.py": "from . import y\n", "fireflyer/p/y.py": "from . import x\n",
        "fireflyer/q/x.py": "from .y import f\n", "fireflyer/q/y.py": "from .x import g\n",
    })
    v = check_tree(tmp_path, ["libs"])
    assert sorted(r.split(" among")[0] for r in _rules(v)) == ["import cycle in fireflyer.p", "import cycle in fireflyer.q"]


def test_type_checking_imports_and_the_package_init_make_no_cycle(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "fireflyer/pkg/__init__.py": "from .engine import Engine\nfrom .mixin import Mixin\n",
        "fireflyer/pkg/engine.py": "from .mixin import Mixin\nclass Engine(Mixin): ...\n",
        "fireflyer/pkg/mixin.py": ("from typing import TYPE_CHECKING\nimport typing\n"
                                   "from fireflyer.pkg import Engine as _E  # the package, not a module\n"
                                   "if TYPE_CHECKING:\n    from .engine import Engine\n"
                                   "if typing.TYPE_CHECKING:\n    from . import engine\n"
                                   "class Mixin: ...\n"),
    })
    assert check_tree(tmp_path, ["libs"]) == []


def test_the_else_branch_of_type_checking_counts(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "fireflyer/pkg/a.py": "from . import b\n",
        "fireflyer/pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from . import a\n",
    })
    assert _rules(check_tree(tmp_path, ["libs"])) == ["import cycle in fireflyer.pkg among a, b"]


def test_a_bench_module_in_a_domain_package_fails(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "fireflyer/fs/bench_fs.py": "",
        "fireflyer/hfreduce/_bench_rank.py": "",
        "fireflyer/kv/bench.py": "",
        "fireflyer/bench/__init__.py": "",
        "fireflyer/bench/fs.py": "from fireflyer.fs import client\n",
        "fireflyer/bench/_bench_helper.py": "",
        "fireflyer/fs/benchmarks_doc.py": "",  # "bench..." all the same
        "fireflyer/fs/client.py": "",
    })
    v = check_tree(tmp_path, ["libs"])
    assert sorted(x.path for x in v) == ["libs/fireflyer/fs/bench_fs.py", "libs/fireflyer/fs/benchmarks_doc.py",
                                         "libs/fireflyer/hfreduce/_bench_rank.py", "libs/fireflyer/kv/bench.py"]
    assert all("belongs in fireflyer.bench" in x.rule for x in v)
    assert str(next(x for x in v if x.path.endswith("bench.py"))) == (
        "libs/fireflyer/kv/bench.py:1: fireflyer.kv.bench is a benchmark: it belongs in fireflyer.bench "
        "(one module per ff bench verb), not in a domain package")


def test_only_the_benchmarks_and_the_cli_import_fireflyer_bench() -> None:
    bad = check_source("from fireflyer.bench.wire import run_bench\n", "fireflyer.fs.client", "libs/fireflyer/fs/client.py")
    assert len(bad) == 1 and "only fireflyer.bench and fireflyer.cli may import" in bad[0].rule
    assert check_source("import fireflyer.bench\n", "services.meta.app", "services/meta/app.py")
    assert check_source("from ..bench import _floor\n", "fireflyer.hfreduce.engine", "libs/fireflyer/hfreduce/engine.py")
    assert check_source("from ._floor import x\n", "fireflyer.bench.flows", "libs/fireflyer/bench/flows.py") == []
    assert check_source("from fireflyer.bench import kv\n", "fireflyer.cli.main", "libs/fireflyer/cli/main.py") == []

"""numba's cache dropped when a source compiled into a module changes (:mod:`fireflyer.hfreduce.jitcache`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from fireflyer.bench import _read_floor as read_floor
from fireflyer.hfreduce import _blocks, _lowp, _rootpass, copies, kernels
from fireflyer.hfreduce.jitcache import STAMP_SUFFIX, cache_dir, drop_stale, sources_digest


def _tree(tmp_path: Path) -> tuple[Path, Path, Path, list[Path]]:
    mod, dep = tmp_path / "loops.py", tmp_path / "kern.py"
    mod.write_text("# loops\n")
    dep.write_text("# kernel v1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    cached = [cache / "loops.up-10.py311.nbi", cache / "loops.up-10.py311.1.nbc"]
    return mod, dep, cache, cached


def _fill(cache: Path, cached: list[Path]) -> Path:
    for f in cached:
        f.write_bytes(b"machine code")
    other = cache / "kern.add-3.py311.nbi"  # another module's cache: never touched
    other.write_bytes(b"other")
    return other


def test_a_cache_is_kept_while_its_sources_stay_and_dropped_once_one_changes(tmp_path: Path) -> None:
    mod, dep, cache, cached = _tree(tmp_path)
    disp = SimpleNamespace(_cache=SimpleNamespace(cache_path=str(cache)))
    other = _fill(cache, cached)
    # never recorded: what is cached is of unknown sources
    assert drop_stale(mod, disp, [mod, dep])
    assert not any(f.exists() for f in cached) and other.exists()
    assert (cache / f"loops{STAMP_SUFFIX}").read_text() == sources_digest([mod, dep])
    _fill(cache, cached)  # numba compiles and caches again
    assert not drop_stale(mod, disp, [dep, mod, dep])  # same sources, any order, repeats
    assert all(f.exists() for f in cached)
    dep.write_text("# kernel v2\n")
    assert drop_stale(mod, disp, [mod, dep])
    assert not any(f.exists() for f in cached) and other.exists()
    assert not drop_stale(mod, disp, [mod, dep])
    assert not list(cache.glob(".*"))  # no temporary stamp left behind


def test_the_cache_directory_is_numbas_else_the_in_tree_pycache(tmp_path: Path) -> None:
    assert cache_dir(SimpleNamespace(_cache=SimpleNamespace(cache_path="/x/y")), tmp_path / "m.py") == Path("/x/y")
    assert cache_dir(object(), tmp_path / "m.py") == tmp_path / "__pycache__"
    assert cache_dir(_blocks.up_chunk, _blocks.__file__) == Path(_blocks.up_chunk._cache.cache_path)


def test_an_unwritable_cache_directory_is_left_alone(tmp_path: Path) -> None:
    mod, dep, cache, _ = _tree(tmp_path)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert drop_stale(mod, SimpleNamespace(_cache=SimpleNamespace(cache_path=str(not_a_dir / "c"))), [mod, dep])


def test_each_jitted_module_names_the_sources_it_compiles_in() -> None:
    def names(mod: object) -> set[str]:
        return {Path(p).name for p in mod.JIT_SOURCES}  # type: ignore[attr-defined]

    assert names(_lowp) == {"_lowp.py"}
    assert names(kernels) == {"kernels.py", "_lowp.py"}
    for mod in (copies, _rootpass, read_floor):
        assert names(mod) == {Path(mod.__file__).name, "kernels.py", "_lowp.py"}
    assert names(_blocks) == {"_blocks.py", "kernels.py", "_lowp.py", "copies.py", "_rootpass.py"}
    # and every stamp beside the real cache matches the sources as they are now
    for mod, disp in ((_blocks, _blocks.up_chunk), (_rootpass, _rootpass.sum_store), (kernels, kernels._reduce_typed)):
        stamp = cache_dir(disp, mod.__file__) / f"{Path(mod.__file__).stem}{STAMP_SUFFIX}"
        assert stamp.read_text() == sources_digest(mod.JIT_SOURCES)

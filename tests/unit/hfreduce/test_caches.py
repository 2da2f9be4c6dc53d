"""CPU cache sizes from sysfs (:mod:`fireflyer.hfreduce.caches`)."""

from __future__ import annotations

from fireflyer.hfreduce.caches import cache_bytes


def test_l2_cache_size_comes_from_sysfs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def index(name: str, level: str, size: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")

    assert cache_bytes(2, str(tmp_path / "missing")) is None
    index("index0", "1", "48K")
    assert cache_bytes(2, str(tmp_path)) is None
    index("index2", "2", "2048K")
    index("index3", "3", "32768K")
    assert cache_bytes(2, str(tmp_path)) == 2 << 20
    (tmp_path / "index2" / "size").write_text("1M\n")
    assert cache_bytes(2, str(tmp_path)) == 1 << 20
    (tmp_path / "index2" / "size").write_text("unknown\n")  # unreadable: no size rather than an error
    assert cache_bytes(2, str(tmp_path)) is None


def test_the_level_1_cache_size_is_the_data_cache_not_the_instruction_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name, kind, size in (("index0", "Instruction", "32K"), ("index1", "Data", "48K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text("1\n")
        (tmp_path / name / "type").write_text(kind + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert cache_bytes(1, str(tmp_path)) == 48 << 10
    assert cache_bytes(3, str(tmp_path)) is None

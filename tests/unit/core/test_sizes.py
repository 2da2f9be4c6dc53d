"""One size grammar for flags, settings and sysfs (fireflyer.core.sizes)."""

from __future__ import annotations

import argparse

import pytest

from fireflyer.core.errors import InvalidArgument, SettingsError
from fireflyer.core.sizes import parse_size, size_arg
from fireflyer.hfreduce import settings


@pytest.mark.parametrize(("text", "n"), [
    ("4", 4), ("4096", 4096), (" 512K ", 512 << 10), ("512k", 512 << 10), ("4M", 4 << 20), ("4 MiB", 4 << 20),
    ("64mb", 64 << 20), ("1G", 1 << 30), ("2T", 2 << 40), ("1.5K", 1536), ("0.5M", 512 << 10), (".5k", 512),
    ("1024K\n", 1 << 20), ("0", 0), (4096, 4096),
])
def test_sizes_people_write(text: str | int, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "four", "4X", "-4", "4 M B", "1e6", "0.5", "1.0001K", "M", True, None, 1.5])
def test_bad_sizes_are_invalid_arguments_naming_the_value(text: object) -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_size(text, what="--chunk-size")  # type: ignore[arg-type]
    assert str(ei.value).startswith("--chunk-size: ")


def test_negative_int_refused() -> None:
    with pytest.raises(InvalidArgument, match="negative"):
        parse_size(-1)


def test_size_arg_is_positive_and_speaks_argparse() -> None:
    assert size_arg("64M") == 64 << 20
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        size_arg("0")
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as"):
        size_arg("lots")
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=size_arg)
    assert p.parse_args(["--size", "1.5G"]).size == 3 << 29


def test_worker_settings_wrap_it_as_settings_errors_naming_the_key() -> None:
    assert settings.parse_size("4MiB", "block_size") == 4 << 20
    with pytest.raises(SettingsError) as ei:
        settings.parse_size("big", "block_size")
    assert ei.value.key == "block_size" and "block_size" in str(ei.value)

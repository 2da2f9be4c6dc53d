"""Property-based fuzz of meta's request validation (issue 48 point 6).

Each property draws values of every shape a request can carry (any int, floats with NaN and
infinities, random unicode and bytes in paths, any depth) and checks that validation
accepts exactly the values an independent oracle calls valid, and that the only exception
it ever raises is the typed ``FsInvalidArgument`` with the errno of its kind of limit.
Bounded: 200 examples per property, no deadline, a few seconds in all.
"""

from __future__ import annotations

import errno as E
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meta_util import ALICE

from fireflyer.core.errors import FsError
from fireflyer.meta import FsInvalidArgument, MetaStore, limits
from fireflyer.meta.paths import split_path

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ints = st.one_of(st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
                 st.sampled_from([0, 1, -1, 2**52, 2**52 + 1, 2**62, 2**63 - 1, 2**64 - 1, 2**64, -(2**63)]))
numbers = st.one_of(ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([limits.MIN_TIME, limits.MAX_TIME, math.nextafter(limits.MAX_TIME, math.inf)]))
anything = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=5), st.binary(max_size=5))


def _outcome(fn: Callable[[], Any]) -> int | None:
    """None if accepted, else the errno of the (only allowed) typed error."""
    try:
        fn()
    except FsInvalidArgument as e:
        assert e.code == "INVALID_ARGUMENT" and e.message
        return e.errno
    return None


@FUZZ
@given(value=anything, chunk_shift=st.integers(min_value=12, max_value=26))
def test_file_length_accepted_iff_a_non_negative_int_the_layout_holds(value: object, chunk_shift: int) -> None:
    chunk = 1 << chunk_shift
    got = _outcome(lambda: limits.check_file_size(value, chunk))
    if type(value) is not int or value < 0:
        assert got == E.EINVAL
    elif value > (2**32) * chunk:
        assert got == E.EFBIG
    else:
        assert got is None


@FUZZ
@given(value=anything)
def test_ids_accepted_iff_a_uint64(value: object) -> None:
    got = _outcome(lambda: limits.check_length(value, "uid"))
    assert got == (None if type(value) is int and 0 <= value < 2**64 else E.EINVAL)


@FUZZ
@given(value=anything)
def test_time_accepted_iff_finite_and_in_range(value: object) -> None:
    got = _outcome(lambda: limits.check_time(value, "mtime"))
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and -(2**60) < value < 2**60 and math.isfinite(float(value))
          and limits.MIN_TIME <= float(value) <= limits.MAX_TIME)
    assert got == (None if ok else E.EINVAL)


KNOWN = [getattr(os, n) for n in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_EXCL", "O_TRUNC", "O_APPEND",
                                  "O_NOFOLLOW", "O_DIRECTORY", "O_CLOEXEC", "O_NONBLOCK")]


@FUZZ
@given(value=st.one_of(anything, st.lists(st.sampled_from(KNOWN)).map(lambda bits: sum(set(bits)))))
def test_flags_accepted_iff_known_bits_and_an_access_mode(value: object) -> None:
    got = _outcome(lambda: limits.check_open_flags(value))
    ok = (type(value) is int and value >= 0 and value & ~limits.KNOWN_OPEN_FLAGS == 0
          and value & os.O_ACCMODE in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR))
    assert got == (None if ok else E.EINVAL)


names = st.one_of(st.text(min_size=1, max_size=8), st.text(alphabet="a/.\0\udc80é", min_size=1, max_size=300),
                  st.sampled_from(["a", ".", "..", "x" * 255, "x" * 256, "é" * 128]))
paths = st.one_of(
    st.lists(names, max_size=12).map(lambda cs: "/" + "/".join(cs)),
    st.tuples(st.integers(min_value=0, max_value=2100), st.sampled_from(["a", "bb", "."])).map(
        lambda t: "/" + "/".join([t[1]] * t[0])),
    st.text(max_size=40), st.binary(max_size=20),
)


def _path_oracle(path: object, new_name: bool) -> int | None:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return E.EINVAL
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        return E.EINVAL
    if len(raw) > 4096:
        return E.ENAMETOOLONG
    comps = [c for c in path.split("/") if c and c != "."]
    if any(len(c.encode()) > 255 for c in comps) or (new_name and len(comps) > 256):
        return E.ENAMETOOLONG
    return None


@FUZZ
@given(path=paths, new_name=st.booleans())
def test_paths_accepted_iff_absolute_utf8_and_within_length_and_depth(path: object, new_name: bool) -> None:
    assert _outcome(lambda: split_path(path, new_name=new_name)) == _path_oracle(path, new_name)


@FUZZ
@given(length=ints, mtime=numbers, flags=ints)
def test_store_calls_never_raise_anything_but_typed_errors(fs: MetaStore, length: int, mtime: float,
                                                           flags: int) -> None:
    """End to end through the store (SQLite): only the typed error, or success."""
    f = fs.create(ALICE, "/home/alice/fz").inode
    for call in (lambda: fs.truncate(ALICE, "/home/alice/fz", length),
                 lambda: fs.report_length(ALICE, f.id, length),
                 lambda: fs.setattr(ALICE, "/home/alice/fz", mtime=mtime)):
        assert _outcome(call) in (None, E.EINVAL, E.EFBIG)
    try:  # valid flags may still fail as POSIX says (O_EXCL: EEXIST, O_DIRECTORY: ENOTDIR)
        fs.create(ALICE, "/home/alice/fz", flags=flags)
    except FsError as e:
        assert isinstance(e, FsInvalidArgument) or e.errno in (E.EEXIST, E.ENOTDIR)
    inode = fs.stat(ALICE, "/home/alice/fz")
    assert 0 <= inode.length <= limits.max_file_size(1 << 20)
    assert math.isfinite(inode.mtime) and limits.MIN_TIME <= inode.mtime <= limits.MAX_TIME


@pytest.mark.parametrize("fn", [limits.check_length, limits.check_time, limits.check_open_flags])
def test_huge_ints_are_refused_with_a_short_message(fn: Callable[..., Any]) -> None:
    for huge in (-(10 ** 5000), 10 ** 5000):  # ids past uint64 are EINVAL too
        with pytest.raises(FsInvalidArgument) as info:
            fn(huge, "x")
        assert len(info.value.message) < 300
    with pytest.raises(FsInvalidArgument) as info:
        limits.check_file_size(10 ** 5000, 1 << 20)
    assert info.value.errno == E.EFBIG and len(info.value.message) < 300

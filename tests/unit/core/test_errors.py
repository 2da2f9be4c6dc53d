import errno
import pickle

import pytest

from fireflyer.core import errors as E


def test_fields_travel_with_the_error():
    e = E.NotFound("chain 7 not found", chain=7, table="t1")
    assert e.fields == {"chain": 7, "table": "t1"} and e.chain == 7
    assert e.to_dict() == {"kind": "NotFound", "code": "NOT_FOUND", "message": "chain 7 not found",
                           "fields": {"chain": 7, "table": "t1"}}
    with pytest.raises(AttributeError):
        _ = e.nope


def test_roundtrip_by_kind_and_fallback_by_code():
    e = E.error_from_dict(E.Conflict("txn conflict", key="k").to_dict())
    assert type(e) is E.Conflict and e.key == "k"
    e = E.error_from_dict({"kind": "SomeNewerError", "code": "NOT_FOUND", "message": "m", "fields": {"x": 1}})
    assert type(e) is E.NotFound and e.x == 1
    assert type(E.error_from_dict({"code": "WHATEVER"})) is E.FireFlyerError


def test_builtin_bases_for_except_clauses():
    assert isinstance(E.NotFound("x"), LookupError)
    assert isinstance(E.DeadlineExceeded("x"), TimeoutError)
    assert isinstance(E.Unavailable("x"), ConnectionError)
    assert isinstance(E.SettingsError("x"), ValueError)


def test_fs_error_carries_errno_and_code():
    e = E.FsError("no such file /a", errno=errno.ENOENT, path="/a")
    assert isinstance(e, OSError) and e.errno == errno.ENOENT and e.code == "NOT_FOUND"
    back = E.error_from_dict(e.to_dict())
    assert isinstance(back, E.FsError) and back.errno == errno.ENOENT and back.path == "/a"


def test_pickle_keeps_type_and_fields():
    e = pickle.loads(pickle.dumps(E.PermissionDenied("no", user="bob")))
    assert type(e) is E.PermissionDenied and e.user == "bob"

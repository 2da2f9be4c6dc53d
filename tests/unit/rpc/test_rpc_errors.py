"""FireFlyerError <-> gRPC status, both ways: pure mapping, then over a real server."""

from __future__ import annotations

import errno
import logging

import grpc
import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core import errors as ff
from fireflyer.rpc import (
    ERROR_DETAILS_KEY,
    RpcServer,
    error_class_for_status,
    error_from_rpc_error,
    status_for_error,
)
from fireflyer.rpc.errors import decode_error_details, encode_error_details, internal_error
from fireflyer.testing.poll import wait_for

ADMIN_TOKEN = "admin-token-for-tests"  # as in conftest.py

ALL_ERRORS = [getattr(ff, name) for name in ff.__all__
              if isinstance(getattr(ff, name), type) and issubclass(getattr(ff, name), ff.FireFlyerError)]


def _make(cls: type[ff.FireFlyerError], message: str = "no such chain", **fields) -> ff.FireFlyerError:
    if cls is ff.FsError:
        return ff.FsError(message, errno=errno.EACCES, **fields)
    return cls(message, **fields)


def _rpc_error(code: grpc.StatusCode, details: str, trailers: tuple = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details=details)


# ------------------------------------------------------------------ pure parts


def test_every_error_class_is_covered() -> None:
    assert len(ALL_ERRORS) >= 18 and ff.ProtocolError in ALL_ERRORS and ff.FsError in ALL_ERRORS


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_status_for_error_is_the_code_name(cls: type[ff.FireFlyerError]) -> None:
    err = _make(cls)
    assert status_for_error(err).name == err.code


def test_status_codes_of_note() -> None:
    assert status_for_error(ff.ProtocolError("bad frame")) is grpc.StatusCode.DATA_LOSS
    assert status_for_error(ff.Conflict("stale version")) is grpc.StatusCode.ABORTED
    assert status_for_error(ff.SettingsError("bad")) is grpc.StatusCode.INVALID_ARGUMENT
    assert status_for_error(ff.FsError("gone", errno=errno.ENOENT)) is grpc.StatusCode.NOT_FOUND
    assert status_for_error(ff.FsError("full", errno=errno.ENOSPC)) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_for_error(ff.FireFlyerError("?")) is grpc.StatusCode.UNKNOWN


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda c: c.name)
def test_every_status_has_a_class(code: grpc.StatusCode) -> None:
    cls = error_class_for_status(code)
    assert issubclass(cls, ff.FireFlyerError)
    if code is grpc.StatusCode.OUT_OF_RANGE:
        assert cls is ff.InvalidArgument  # no class of its own: the nearest one
    elif code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN):
        assert cls.code == code.name  # the class registered as default for that code


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_details_round_trip(cls: type[ff.FireFlyerError]) -> None:
    err = _make(cls, chain=7, node="n3", ok=True, ratio=0.5, missing=None)
    back = decode_error_details(encode_error_details(err))
    assert type(back) is cls
    assert back.fields == err.fields and back.message == err.message and back.code == err.code


def test_oversize_details_keep_type_and_message() -> None:
    err = ff.NotFound("x" * 5000, blob="y" * 10000)
    data = encode_error_details(err)
    assert len(data) < 4096
    back = decode_error_details(data)
    assert type(back) is ff.NotFound and back.fields == {"details_truncated": True}


def test_malformed_details_are_ignored() -> None:
    assert decode_error_details(b"not json") is None
    assert decode_error_details(b'{"no": "kind"}') is None


def test_rpc_error_with_details_rebuilds_the_error() -> None:
    err = ff.Conflict("chain 7 moved on", chain=7, expected=12, got=11)
    back = error_from_rpc_error(_rpc_error(grpc.StatusCode.ABORTED, "chain 7 moved on",
                                           ((ERROR_DETAILS_KEY, encode_error_details(err)),)))
    assert type(back) is ff.Conflict and back.fields == {"chain": 7, "expected": 12, "got": 11}


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.DEADLINE_EXCEEDED, ff.DeadlineExceeded),
    (grpc.StatusCode.UNAVAILABLE, ff.Unavailable),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ff.ResourceExhausted),
    (grpc.StatusCode.UNIMPLEMENTED, ff.Unimplemented),
    (grpc.StatusCode.UNKNOWN, ff.FireFlyerError),
])
def test_rpc_error_without_details_falls_back_to_the_code(code: grpc.StatusCode, cls: type) -> None:
    back = error_from_rpc_error(_rpc_error(code, "Deadline Exceeded"), method="/ff.x.v1.X/Y", target="h:1")
    assert type(back) is cls
    assert back.fields == {"method": "/ff.x.v1.X/Y", "target": "h:1"}
    assert "Deadline Exceeded" in str(back) and "/ff.x.v1.X/Y" in str(back) and "h:1" in str(back)


def test_internal_error_names_the_method() -> None:
    err = internal_error("/ff.x.v1.X/Y", KeyError("k"))
    assert isinstance(err, ff.Internal) and "/ff.x.v1.X/Y" in str(err) and "KeyError" in str(err)
    assert err.fields == {"method": "/ff.x.v1.X/Y", "exception": "KeyError"}


# ------------------------------------------------------------ against a server


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
async def test_server_error_reaches_client_typed(cls: type[ff.FireFlyerError], server: RpcServer, dial) -> None:
    fields = {"chain": "7", "node": "n3"}
    if cls is ff.FsError:
        fields["errno"] = str(errno.EACCES)
    req = echo_pb2.FailRequest(kind=cls.__name__, message="no such chain", fields=fields)

    # the typed client: same class, same fields (ints stay ints)
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    with pytest.raises(cls) as info:
        await stub.Fail(req)
    err = info.value
    assert type(err) is cls and str(err).endswith("no such chain")
    expect = {"chain": 7, "node": "n3"} | ({"errno": errno.EACCES} if cls is ff.FsError else {})
    assert err.fields == expect

    # a plain grpc client sees the status code and a readable message
    async with grpc.aio.insecure_channel(server.address) as raw:
        with pytest.raises(grpc.aio.AioRpcError) as raw_info:
            await echo_pb2_grpc.EchoServiceStub(raw).Fail(req, metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),))
    assert raw_info.value.code().name == err.code
    assert raw_info.value.details() == "no such chain"


async def test_not_found_keeps_its_fields(server: RpcServer, dial) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    with pytest.raises(ff.NotFound) as info:
        await stub.Fail(echo_pb2.FailRequest(kind="NotFound", message="no such chain", fields={"chain": "7"}))
    assert info.value.fields == {"chain": 7} and info.value.chain == 7


async def test_unexpected_exception_is_internal_and_logged(server: RpcServer, dial,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))

    def records(event: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "ff_event", "") == event]

    with caplog.at_level(logging.INFO, logger="fireflyer.rpc"):
        with pytest.raises(ff.Internal) as info:
            await stub.Fail(echo_pb2.FailRequest(kind="ZeroDivisionError"))
        # the server writes its access-log line once the call has ended, which the client may see first
        await wait_for(lambda: records("rpc.call"), timeout_s=5, what="the server's rpc.call log line")
    assert "/ff.echo.v1.EchoService/Fail" in str(info.value) and "ZeroDivisionError" in str(info.value)
    logged = records("rpc.unexpected_error")
    assert logged and logged[0].exc_info and logged[0].exc_info[0] is ZeroDivisionError
    calls = [r.ff_fields for r in records("rpc.call")]  # type: ignore[attr-defined]
    assert calls[-1]["method"] == "/ff.echo.v1.EchoService/Fail"
    assert (calls[-1]["user"], calls[-1]["code"]) == ("root", "INTERNAL") and calls[-1]["ms"] >= 0

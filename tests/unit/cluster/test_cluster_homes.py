"""ff up's homes step (the parts that need no cluster) and the ff fs / ff whoami arguments."""

from __future__ import annotations

import argparse

import pytest

from fireflyer.cli import fs as fs_cli
from fireflyer.cluster.homes import home_users, homes_line
from fireflyer.core.errors import InvalidArgument
from fireflyer.fs.home import Identity
from fireflyer.rpc import TokenEntry


def test_homes_are_made_for_user_role_tokens_only() -> None:
    tokens = [TokenEntry(token="a", user="admin", roles=["admin"]), TokenEntry(token="b", user="alice"),
              TokenEntry(token="c", user="bob", roles=["user"]), TokenEntry(token="d", user="svc", roles=["service"])]
    assert [t.user for t in home_users(tokens)] == ["alice", "bob"]
    assert homes_line(["/home/alice", "/home/bob"]) == "homes: /home/alice, /home/bob"
    assert homes_line([]).startswith("homes: (none")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ff")
    fs_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_fs_chmod_chown_whoami_and_mkdir_arguments() -> None:
    ns = _parse("fs", "chmod", "750", "data")
    assert (ns.mode, ns.path) == ("750", "data")
    ns = _parse("fs", "chown", "bob", "/x", "--role", "admin")
    assert (ns.user, ns.path, ns.role) == ("bob", "/x", "admin")
    ns = _parse("whoami", "--json", "--state-dir", "s")
    assert ns.json and ns.state_dir == "s" and ns.command == "whoami"
    assert _parse("fs", "mkdir", "-p", "d").mode is None  # no -m: an existing directory is fine as it is
    assert _parse("fs", "ls").path == "."  # the home


def test_octal_modes() -> None:
    assert fs_cli._octal("755") == 0o755 and fs_cli._octal("0700") == 0o700 and fs_cli._octal("1777") == 0o1777
    for bad in ("rwx", "8", "17777", "-1"):
        with pytest.raises(InvalidArgument):
            fs_cli._octal(bad)


def test_whoami_text() -> None:
    ident = Identity(user="alice", roles=("user",), home="/home/alice", uid=1, gid=1)
    assert fs_cli.whoami_text(ident) == "user:  alice\nroles: user\nhome:  /home/alice"
    assert fs_cli.whoami_text(Identity(user="svc", roles=("service",))).endswith("home:  -")

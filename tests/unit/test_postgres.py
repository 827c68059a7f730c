"""The local PostgreSQL server's pieces that need no server: where its programs are, the URL."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tools import hostpkg, postgres


def _install(lib: Path, version: str, *tools: str) -> None:
    bin_dir = lib / version / "bin"
    bin_dir.mkdir(parents=True)
    for name in tools:
        (bin_dir / name).touch()


def test_server_programs_come_from_the_newest_installed_major_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "LIB_DIR", tmp_path)
    assert postgres.find_tool("initdb") is None
    _install(tmp_path, "9", "initdb", "pg_ctl")
    _install(tmp_path, "15", "initdb")
    (tmp_path / "common" / "bin").mkdir(parents=True)  # not a version
    assert postgres.find_tool("initdb") == tmp_path / "15" / "bin" / "initdb"
    assert postgres.find_tool("pg_ctl") == tmp_path / "9" / "bin" / "pg_ctl"
    with pytest.raises(postgres.PostgresError, match="Debian package postgresql"):
        postgres.tool("psql")


def test_missing_server_programs_install_debians_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "LIB_DIR", tmp_path)
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        if cmd[:2] == ["apt-get", "install"]:
            _install(tmp_path, "15", *postgres.SERVER_TOOLS)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(hostpkg.subprocess, "run", run)
    monkeypatch.setattr(hostpkg.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hostpkg.shutil, "which", lambda name: f"/usr/bin/{name}")
    postgres.ensure_installed()
    assert calls == [["apt-get", "install", "-y", "-q", "postgresql"]]
    postgres.ensure_installed()  # present now: no second install
    assert len(calls) == 1


def test_without_root_a_missing_server_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "LIB_DIR", tmp_path)
    monkeypatch.setattr(hostpkg.os, "geteuid", lambda: 1000)
    with pytest.raises(postgres.PostgresError, match=r"\(postgresql\) as root"):
        postgres.ensure_installed()


def test_the_login_url_holds_no_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path))
    postgres.root_dir().mkdir()
    (postgres.root_dir() / "port").write_text("54321\n")
    (postgres.root_dir() / "password").write_text("s3cr3t-pw\n")
    assert postgres.url() == "postgres://pulumi@127.0.0.1:54321/pulumi?sslmode=disable"
    assert postgres.client_env() == {"PGPASSWORD": "s3cr3t-pw"}


def test_a_server_program_runs_as_the_servers_user_through_setpriv_not_a_fork(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As root, initdb and pg_ctl run as the server's user by a ``setpriv`` prefix, never by
    subprocess's ``user``/``group`` arguments: those make CPython fork rather than vfork, and
    the fork runs the gRPC library's fork handlers, which crashed initdb's child (SIGSEGV,
    "initdb failed (-11)") in a test process whose gRPC threads were busy (CI, 2 December)."""
    import pwd

    calls: list[tuple[list[str], dict[str, Any]]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((cmd, kwargs))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    class Entry:
        pw_uid, pw_gid = 101, 102

    monkeypatch.setattr(postgres.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pwd, "getpwnam", lambda name: Entry())
    monkeypatch.setattr(postgres.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(postgres, "root_dir", lambda: tmp_path)
    monkeypatch.setattr(postgres.subprocess, "run", run)
    postgres._server("/usr/lib/postgresql/15/bin/initdb", "-D", "data")
    ((cmd, kwargs),) = calls
    assert cmd == [
        "/usr/bin/setpriv",
        "--reuid=101",
        "--regid=102",
        "--clear-groups",
        "--",
        "/usr/lib/postgresql/15/bin/initdb",
        "-D",
        "data",
    ]
    assert not {"user", "group", "extra_groups", "preexec_fn"} & kwargs.keys()

"""A local PostgreSQL server: the kind of shared state backend a team of administrators uses.

Why: one administrator keeps the Pulumi state in a file backend (``.state/pulumi-backend``
here); a team shares a backend whose lock keeps two ``pulumi up`` runs off one stack.
PostgreSQL (``pulumi login postgres://…``, in the CLI since 3.176, driver ``lib/pq``) is one
that Debian ships, so the local environment can run it with no download beyond the package:
``postgresql`` is installed with apt-get when missing (:mod:`tools.hostpkg`).

The server is this state directory's own, like the local cluster: data in
``<state>/postgres/data``, its socket in ``<state>/postgres/run``, listening on a free port of
127.0.0.1 only, password authentication (scram-sha-256) for the role ``pulumi``, whose random
password is in ``<state>/postgres/password``. PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` user the Debian package creates. Pulumi's DIY backend creates
its table (``pulumi_state``) in the database ``pulumi`` at the first login.

Usage::

    python -m tools.postgres start    # start (initialise first if needed); print the login URL
    python -m tools.postgres url      # the login URL of the running server
    python -m tools.postgres stop     # stop the server and remove its data
    python -m tools.postgres status   # exit 0 when the server runs

The URL holds no password (``pulumi login`` keeps the URL in ``~/.pulumi/credentials.json``):
the CLI's driver reads it from ``PGPASSWORD`` (:func:`client_env`).
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tools import hostpkg, localenv

PACKAGE = "postgresql"
# The Debian package keeps the server programs out of PATH, per major version.
LIB_DIR = Path("/usr/lib/postgresql")
SERVER_TOOLS = ("initdb", "pg_ctl", "postgres", "psql", "pg_dump")
ROLE = "pulumi"
DATABASE = "pulumi"
SERVER_USER = "postgres"  # created by the Debian package; the server never runs as root


class PostgresError(RuntimeError):
    """The local server cannot be started or reached; the message says why."""


def _log(msg: str) -> None:
    print(f"[postgres] {msg}", file=sys.stderr, flush=True)


def root_dir() -> Path:
    return localenv.state_dir() / "postgres"


def data_dir() -> Path:
    return root_dir() / "data"


def _port_file() -> Path:
    return root_dir() / "port"


def _password_file() -> Path:
    return root_dir() / "password"


def find_tool(name: str) -> Path | None:
    """The newest installed major version's ``name`` (initdb, pg_ctl, ...), if any."""
    versions = sorted(
        (p for p in LIB_DIR.glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    for bin_dir in versions:
        if (bin_dir / name).is_file():
            return bin_dir / name
    return None


def tool(name: str) -> str:
    found = find_tool(name)
    if found is None:
        raise PostgresError(f"{name} not found under {LIB_DIR}/*/bin (Debian package {PACKAGE})")
    return str(found)


def ensure_installed() -> None:
    """Install Debian's ``postgresql`` when its server programs are missing."""
    try:
        hostpkg.ensure({t: PACKAGE for t in SERVER_TOOLS}, found=lambda t: find_tool(t) is not None)
    except hostpkg.HostPackageError as err:
        raise PostgresError(str(err)) from err


def _server_user() -> list[str]:
    """The command prefix that runs a server program as the server's user (none if not root).

    util-linux's ``setpriv``, not subprocess's ``user``/``group`` arguments: with those,
    CPython forks instead of using vfork, and a fork runs the fork handlers of the gRPC
    library the Pulumi SDK loads; in a test process whose gRPC threads were busy, initdb's
    child died of SIGSEGV before its exec (CI run of 2 December 2026: "initdb failed (-11)").
    """
    if os.geteuid() != 0:
        return []
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError as err:
        raise PostgresError(
            f"running as root, and there is no user {SERVER_USER!r} to run the server as "
            f"(the Debian package {PACKAGE} creates it)"
        ) from err
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise PostgresError("running as root needs setpriv (Debian package util-linux)")
    return [
        setpriv,
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--",
    ]


def _server(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a server program (initdb, pg_ctl) as the server's user, in its directory."""
    done = subprocess.run(
        [*_server_user(), *args],
        cwd=root_dir(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise PostgresError(
            f"{Path(args[0]).name} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done


def password() -> str:
    return _password_file().read_text().strip()


def port() -> int:
    return int(_port_file().read_text())


def url() -> str:
    """``pulumi login`` URL of the running server (no password: see :func:`client_env`)."""
    return f"postgres://{ROLE}@127.0.0.1:{port()}/{DATABASE}?sslmode=disable"


def client_env() -> dict[str, str]:
    """What a client (the CLI's driver, psql) needs besides the URL."""
    return {"PGPASSWORD": password()}


def is_running() -> bool:
    if not (data_dir() / "PG_VERSION").exists() or find_tool("pg_ctl") is None:
        return False
    return _server(tool("pg_ctl"), "status", "-D", str(data_dir()), check=False).returncode == 0


def _prepare_root() -> None:
    """The server's directory, owned by the server's user (it holds the data and password)."""
    root = root_dir()
    root.mkdir(parents=True, exist_ok=True)
    (root / "run").mkdir(exist_ok=True)
    if not _password_file().exists():
        _password_file().write_text(secrets.token_urlsafe(24) + "\n")
    user = _server_user()
    if user:
        uid, gid = pwd.getpwnam(SERVER_USER).pw_uid, pwd.getpwnam(SERVER_USER).pw_gid
        for path in (root, root / "run", _password_file()):
            os.chown(path, uid, gid)
    os.chmod(root, 0o700)
    os.chmod(_password_file(), 0o600)
    # The server's user must be able to reach its directory through the state directory.
    for parent in root.parents:
        if user and not os.stat(parent).st_mode & 0o001:
            raise PostgresError(
                f"{parent} is not searchable by the user {SERVER_USER!r}, which runs the server "
                f"in {root}: chmod o+x {parent}, or set PMEM_CSI_STATE_DIR elsewhere"
            )


def _initdb() -> None:
    _log(f"initialising {data_dir()}")
    _server(
        tool("initdb"),
        "-D", str(data_dir()),
        "-U", ROLE,
        f"--pwfile={_password_file()}",
        "--auth=scram-sha-256",
        "--encoding=UTF8",
        "--no-locale",
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def psql(sql: str, database: str = DATABASE) -> str:
    """Run SQL as the ``pulumi`` role over TCP (as any client would); return its output."""
    done = subprocess.run(
        [tool("psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
         "-p", str(port()), "-U", ROLE, "-d", database, "-c", sql],
        env={**os.environ, **client_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise PostgresError(f"psql failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def dump() -> str:
    """Everything the database holds, as SQL (``pg_dump``): what a backup of it would contain."""
    done = subprocess.run(
        [tool("pg_dump"), "-h", "127.0.0.1", "-p", str(port()), "-U", ROLE, DATABASE],
        env={**os.environ, **client_env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise PostgresError(f"pg_dump failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def start() -> str:
    """Start the server unless it runs (initialising it first if needed); return its URL."""
    ensure_installed()
    if is_running():
        return url()
    _prepare_root()
    if not (data_dir() / "PG_VERSION").exists():
        shutil.rmtree(data_dir(), ignore_errors=True)
        _initdb()
    chosen = _free_port()
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={chosen} "
        f"-c unix_socket_directories={root_dir() / 'run'}"
    )
    _log(f"starting on 127.0.0.1:{chosen}")
    _server(
        tool("pg_ctl"), "start", "-D", str(data_dir()), "-l", str(root_dir() / "postgres.log"),
        "-w", "-t", "60", "-o", options,
    )  # fmt: skip
    _port_file().write_text(f"{chosen}\n")
    if not psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", "postgres").strip():
        psql(f"CREATE DATABASE {DATABASE}", "postgres")
    return url()


def stop() -> None:
    """Stop the server (fast shutdown: open sessions are ended) and remove its data."""
    if is_running():
        _log("stopping")
        _server(tool("pg_ctl"), "stop", "-D", str(data_dir()), "-m", "fast", "-w", "-t", "60")
    shutil.rmtree(root_dir(), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.postgres", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("start", help="start the local server; print its login URL")
    sub.add_parser("url", help="print the login URL of the running server")
    sub.add_parser("stop", help="stop the local server and remove its data")
    sub.add_parser("status", help="exit 0 when the local server runs")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "start":
            print(start())
        elif args.cmd == "url":
            print(url())
        elif args.cmd == "stop":
            stop()
        else:
            running = is_running()
            print("running" if running else "not running")
            return 0 if running else 1
    except PostgresError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

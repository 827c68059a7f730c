#!/usr/bin/env python3
"""A stand-in for the ``pulumi-language-python`` plugin, for machines that cannot install it.

Why it exists: the Pulumi CLI runs Python programs through a language plugin named
``pulumi-language-python`` that it finds on PATH (next to the CLI). The Go module proxy these
machines reach refuses every version of that plugin's module, so ``pulumi up`` on
``__main__.py`` could not run here at all. This file does the plugin's job with what the Python
SDK already ships: the ``LanguageRuntime`` gRPC service. A normal Pulumi install has the
official plugin and never uses this file.

What it does, as the official plugin does:

- ``langhost.sh`` (installed as ``pulumi-language-python``) starts this file (installed as
  ``pulumi-language-python-host``) with ``python3`` from PATH, its stderr parked until Python
  has installed quiet signal handlers;
- argv is ``[-tracing URL] [-use-executor PATH] [ENGINE_ADDRESS]`` (Go-style flags; the CLI
  passes the engine address last); ``-version`` prints the version;
- it serves ``LanguageRuntime`` on a free port of 127.0.0.1 and prints the port as the first
  line of stdout;
- ``Run`` starts the program in a *new* Python process with the executor
  ``pulumi-language-python-exec`` (installed next to this file) and passes everything the
  CLI sends: program directory and entry point, project, stack, organization, dry run,
  parallelism, the monitor and engine addresses, config (``PULUMI_CONFIG``) and which config
  keys are secret (``PULUMI_CONFIG_SECRET_KEYS``). Exit code 32 means "the program already
  reported its error" and is answered with ``bail`` so the CLI does not print it twice;
- the interpreter is the project's virtualenv: ``runtime.options.virtualenv`` of
  ``Pulumi.yaml`` if set, else ``.venv`` in the program or project directory, else
  ``$PULUMI_PYTHON_CMD`` or ``python3`` from PATH;
- ``Cancel`` (and SIGINT/SIGTERM) interrupt a running program; SIGINT/SIGTERM, or the CLI
  going away, stop the server quietly (no traceback: the CLI stops every plugin with SIGINT
  at the end of each command).

It must run standalone (installed next to the CLI), so it imports
nothing from this project, only ``grpc`` and the ``pulumi`` SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The exit code of the executor when it has already shown the error to the user.
USER_ACTIONABLE_EXIT = 32
EXECUTOR_NAME = "pulumi-language-python-exec"
# The executor starts as the host does (see langhost.sh): stderr on /dev/null, the real one on
# fd 3, until its quiet signal handlers are installed (restore_stderr).
QUIET_START = [
    "/bin/sh",
    "-c",
    'PMEM_CSI_PARKED_STDERR=3 exec "$0" "$@" 3>&2 2>/dev/null',
]
PARKED_STDERR_ENV = "PMEM_CSI_PARKED_STDERR"


def restore_stderr() -> None:
    """Point fd 2 back at the real stderr that the launcher parked (only if it did)."""
    fd = os.environ.pop(PARKED_STDERR_ENV, None)
    if fd is None:
        return
    try:
        os.dup2(int(fd), 2)
        os.close(int(fd))
    except (OSError, ValueError):
        pass


def _reexec_in_project_venv() -> None:
    """Started by an interpreter without grpc/pulumi: retry with the project's virtualenv.

    The CLI starts plugins in the program directory, so ``./.venv`` is the project's.
    """
    candidate = Path.cwd() / ".venv" / "bin" / "python"
    if candidate.exists() and Path(sys.executable).resolve() != candidate.resolve():
        os.execv(str(candidate), [str(candidate), os.path.abspath(__file__), *sys.argv[1:]])
    print(
        f"{Path(sys.argv[0]).name}: the Python SDK (pulumi, grpcio) is not importable by "
        f"{sys.executable} and there is no ./.venv; install requirements.txt",
        file=sys.stderr,
    )
    raise SystemExit(1)


@dataclass(frozen=True)
class HostArgs:
    """What the CLI passed on the command line."""

    engine_address: str = ""
    tracing: str = ""
    executor: str = ""
    show_version: bool = False


def parse_argv(argv: Sequence[str]) -> HostArgs:
    """Parse Go ``flag``-style arguments (``-x v``, ``-x=v``, ``--x v``); unknown flags are ignored.

    Ignoring (rather than rejecting) unknown flags keeps the stand-in working when a newer CLI
    passes a flag the official plugin learned later.
    """
    values: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            positional.extend(argv[i + 1 :])
            break
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.lstrip("-").partition("=")
            if name == "version":
                values[name] = "true"
            elif eq:
                values[name] = value
            elif i + 1 < len(argv):
                values[name] = argv[i + 1]
                i += 1
            i += 1
            continue
        positional.append(arg)
        i += 1
    return HostArgs(
        engine_address=positional[0] if positional else "",
        tracing=values.get("tracing", ""),
        executor=values.get("use-executor", ""),
        show_version=values.get("version", "false") == "true",
    )


def _venv_python(venv: Path) -> Path | None:
    for name in ("bin/python", "bin/python3", "Scripts/python.exe"):
        if (venv / name).exists():
            return venv / name
    return None


def resolve_interpreter(
    root_directory: str, program_directory: str, options: Mapping[str, Any], env: Mapping[str, str]
) -> str:
    """The Python that runs the program: the project's virtualenv when there is one."""
    root = Path(root_directory or program_directory or ".")
    program = Path(program_directory or root_directory or ".")
    configured = options.get("virtualenv")
    if isinstance(configured, str) and configured:
        venv = Path(configured) if os.path.isabs(configured) else root / configured
        python = _venv_python(venv)
        if python is None:
            raise FileNotFoundError(
                f"Pulumi.yaml runtime option virtualenv={configured!r}: no Python in {venv}; "
                "create it (python3 -m venv) and install requirements.txt"
            )
        return str(python)
    for directory in (program, root):
        python = _venv_python(directory / ".venv")
        if python is not None:
            return str(python)
    return env.get("PULUMI_PYTHON_CMD") or "python3"


def executor_arguments(req: Any, engine_address: str, tracing: str) -> list[str]:
    """The executor's command line for one RunRequest (the official plugin's flag set)."""
    args: list[str] = []

    def add(flag: str, value: str) -> None:
        if value:
            args.extend([f"--{flag}", value])

    add("monitor", req.monitor_address)
    add("engine", engine_address)
    add("project", req.project)
    add("root_directory", req.info.root_directory)
    add("stack", req.stack)
    add("pwd", req.pwd)
    add("dry_run", "true" if req.dryRun else "false")
    add("parallel", str(req.parallel))
    add("tracing", tracing)
    add("organization", req.organization)
    args.append(req.info.entry_point or req.program or ".")
    args.extend(req.args)
    return args


def executor_environment(req: Any, base: Mapping[str, str]) -> dict[str, str]:
    """The program's environment: ours plus the config and the names of its secret keys."""
    env = dict(base)
    env["PULUMI_CONFIG"] = json.dumps(dict(req.config))
    env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(list(req.configSecretKeys))
    return env


def exit_status_response(returncode: int) -> tuple[str, bool]:
    """(error, bail) for the executor's exit status, as the official plugin answers."""
    if returncode == 0:
        return "", False
    if returncode == USER_ACTIONABLE_EXIT:
        return "", True
    if returncode < 0:
        return f"program exited unexpectedly (signal {-returncode})", False
    return f"program exited with non-zero exit code: {returncode}", False


def _sdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pulumi")
    except PackageNotFoundError:
        return "0.0.0"


def _import_protos() -> tuple[Any, Any, Any]:
    """The SDK's generated LanguageRuntime modules, without running ``pulumi/__init__``.

    Why: the CLI starts this host twice per ``pulumi up``/``preview``, and importing the
    ``pulumi`` package (the whole SDK) costs about 0.3 CPU-seconds each time on the machines
    here (BENCHMARKS.md), while the host needs only the generated protobuf modules. Those
    import each other relatively, so empty package objects pointing at the SDK's directories
    are enough. This process never runs user code (the program runs in the executor), so
    nothing else sees these stand-ins. Any surprise falls back to the plain import.
    """
    import importlib
    import importlib.util
    import types

    if "pulumi" not in sys.modules:
        try:
            spec = importlib.util.find_spec("pulumi")
            base = Path(spec.submodule_search_locations[0])  # type: ignore[union-attr,index]
            for name, sub in (
                ("pulumi", base),
                ("pulumi.runtime", base / "runtime"),
                ("pulumi.runtime.proto", base / "runtime" / "proto"),
            ):
                package = types.ModuleType(name)
                package.__path__ = [str(sub)]
                sys.modules[name] = package
            return tuple(  # type: ignore[return-value]
                importlib.import_module(f"pulumi.runtime.proto.{m}")
                for m in ("language_pb2", "language_pb2_grpc", "plugin_pb2")
            )
        except Exception:  # fall back to the documented import path
            for name in [n for n in sys.modules if n == "pulumi" or n.startswith("pulumi.")]:
                del sys.modules[name]
    from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

    return language_pb2, language_pb2_grpc, plugin_pb2


def make_servicer(args: HostArgs, executor: Path) -> Any:
    """The LanguageRuntime servicer (built here so importing this module needs no SDK)."""
    from google.protobuf import json_format

    language_pb2, language_pb2_grpc, plugin_pb2 = _import_protos()

    class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._running: set[subprocess.Popen[bytes]] = set()

        def interrupt_all(self) -> None:
            with self._lock:
                for proc in self._running:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)

        def GetPluginInfo(self, request: Any, context: Any) -> Any:
            return plugin_pb2.PluginInfo(version=_sdk_version())

        def GetRequiredPlugins(self, request: Any, context: Any) -> Any:
            # The project's providers are installed explicitly (offline, no acquisition).
            return language_pb2.GetRequiredPluginsResponse()

        def GetRequiredPackages(self, request: Any, context: Any) -> Any:
            return language_pb2.GetRequiredPackagesResponse()

        def About(self, request: Any, context: Any) -> Any:
            return language_pb2.AboutResponse(
                executable=sys.executable,
                version=".".join(str(v) for v in sys.version_info[:3]),
            )

        def Cancel(self, request: Any, context: Any) -> Any:
            from google.protobuf import empty_pb2

            self.interrupt_all()
            return empty_pb2.Empty()

        def Run(self, req: Any, context: Any) -> Any:
            options = json_format.MessageToDict(req.info.options) if req.info.options else {}
            try:
                python = resolve_interpreter(
                    req.info.root_directory, req.info.program_directory, options, os.environ
                )
            except FileNotFoundError as err:
                return language_pb2.RunResponse(error=str(err))
            cmd = [
                *QUIET_START,
                python,
                "-u",
                str(executor),
                *executor_arguments(req, args.engine_address, args.tracing),
            ]
            # stdout/stderr are inherited: the CLI shows the program's prints as diagnostics.
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=req.pwd or req.info.program_directory or None,
                    env=executor_environment(req, os.environ),
                )
            except OSError as err:
                return language_pb2.RunResponse(
                    error=f"problem executing program (could not run {python}): {err}"
                )
            with self._lock:
                self._running.add(proc)
            context.add_callback(lambda: proc.poll() is None and proc.send_signal(signal.SIGINT))
            try:
                returncode = proc.wait()
            finally:
                with self._lock:
                    self._running.discard(proc)
            sys.stdout.flush()
            error, bail = exit_status_response(returncode)
            return language_pb2.RunResponse(error=error, bail=bail)

    return LanguageHost()


def serve(args: HostArgs) -> int:
    # Handlers first: the CLI may stop us at any moment, even before the port is printed.
    stop = threading.Event()
    running: list[Any] = []

    def on_signal(signum: int, frame: Any) -> None:
        for servicer in running:
            servicer.interrupt_all()
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    import grpc

    _, language_pb2_grpc, _ = _import_protos()
    executor = Path(args.executor) if args.executor else Path(__file__).with_name(EXECUTOR_NAME)
    if not executor.exists():
        print(f"missing executor {executor}", file=sys.stderr)
        return 1
    servicer = make_servicer(args, executor)
    running.append(servicer)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
    )
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)

    # If the CLI dies without stopping us (kill -9), do not linger as an orphan.
    parent = os.getppid()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            servicer.interrupt_all()
            break
    server.stop(grace=5).wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_argv(sys.argv[1:] if argv is None else argv)
    if args.show_version:
        print(_sdk_version())
        return 0
    return serve(args)


def _exit_quietly(signum: int, frame: Any) -> None:
    os._exit(0)


if __name__ == "__main__":
    # Until serve() installs its own handlers, a stop signal just ends the process quietly.
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.signal(signal.SIGTERM, _exit_quietly)
    restore_stderr()
    import importlib.util

    if importlib.util.find_spec("grpc") is None or importlib.util.find_spec("pulumi") is None:
        _reexec_in_project_venv()
    raise SystemExit(main())

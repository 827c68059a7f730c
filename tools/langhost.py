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
- it reads ``runtime.options`` of ``Pulumi.yaml`` as the official host does (``virtualenv``,
  ``toolchain``, ``typechecker``; wrong types and values are refused with its messages). The
  interpreter is the virtualenv that ``virtualenv`` names (relative to the project root), run
  with that virtualenv activated; without the option it is ``$PULUMI_PYTHON_CMD`` or
  ``python3`` from PATH: a ``.venv`` no option names is not used. A named virtualenv that
  does not exist fails ``Run`` with the official message, and is created (``python3 -m venv``
  and ``pip install -r requirements.txt``) by ``GetRequiredPackages``, as the official pip
  toolchain does. Only the pip toolchain is served: ``uv`` or ``poetry`` (named, or found by
  their lock file) is refused by name;
- ``GetRequiredPlugins`` is unimplemented, as in the official host, and
  ``GetRequiredPackages`` lists the resource plugin (name and version) of every installed
  Pulumi package from its ``pulumi-plugin.json`` (here: ``kubernetes`` at the pinned version),
  so the CLI checks that the plugin is installed before it runs the program; ``About``
  reports the program's interpreter and toolchain;
- ``Cancel`` (and SIGINT/SIGTERM) interrupt a running program; SIGINT/SIGTERM, or the CLI
  going away, stop the server quietly (no traceback: the CLI stops every plugin with SIGINT
  at the end of each command).

It must run standalone (installed next to the CLI), so it imports
nothing from this project, only ``grpc`` and the ``pulumi`` SDK.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
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

    This is the host's own interpreter (the official host is a Go binary and needs none), not
    the program's. The CLI starts plugins in the program directory, so ``./.venv`` is the
    project's. A virtualenv's python links to its base interpreter, so the two are told apart
    by ``sys.prefix``, not by the resolved executable.
    """
    candidate = Path.cwd() / ".venv" / "bin" / "python"
    if candidate.exists() and Path(sys.prefix).resolve() != candidate.parent.parent.resolve():
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


class HostError(Exception):
    """A request the host cannot serve; the message is the official plugin's where it has one."""


# The official host's `packagesWithoutPlugins`: known to have no resource plugin.
PACKAGES_WITHOUT_PLUGINS = frozenset({"pulumi-policy", "pulumi-esc-sdk"})
TOOLCHAINS = ("pip", "poetry", "uv")
# A plugin's virtualenv when its PulumiPlugin.yaml names none (the official parseOptions).
PLUGIN_DEFAULT_VIRTUALENV = "venv"
# RunPluginRequest.kind of a policy pack, which the official host starts through its own proxy.
ANALYZER_KIND = "analyzer"
TYPECHECKERS = ("mypy", "pyright")


@dataclass(frozen=True)
class PythonOptions:
    """``runtime.options`` of Pulumi.yaml as the official host reads them (``parseOptions``)."""

    root: str
    program_dir: str
    virtualenv: str = ""
    toolchain: str = ""  # "" is the official Auto: uv.lock / poetry.lock decide, else pip
    typechecker: str = ""


def parse_options(
    root: str, program_dir: str, options: Mapping[str, Any], *, is_plugin: bool = False
) -> PythonOptions:
    """Read the runtime options, rejecting what the official host rejects, with its messages.

    ``is_plugin``: a plugin (a component provider's ``PulumiPlugin.yaml``) never runs in the
    ambient Python: with the pip toolchain and no ``virtualenv`` option, its virtualenv is
    ``venv`` next to it, as in the official host.
    """
    fields: dict[str, str] = {}
    for key, allowed in (("virtualenv", None), ("typechecker", TYPECHECKERS),
                         ("toolchain", TOOLCHAINS)):  # fmt: skip
        if key not in options:
            continue
        value = options[key]
        if not isinstance(value, str):
            raise HostError(f"{key} option must be a string")
        if allowed is not None and value not in allowed:
            raise HostError(f"unsupported {key} option: {value}")
        fields[key] = value
    if is_plugin and fields.get("toolchain", "pip") == "pip" and not fields.get("virtualenv"):
        fields["virtualenv"] = PLUGIN_DEFAULT_VIRTUALENV
    return PythonOptions(root=root, program_dir=program_dir, **fields)


def _searchup(directory: str, name: str) -> bool:
    current = Path(directory or ".").absolute()
    return any((d / name).exists() for d in (current, *current.parents))


def resolve_toolchain(opts: PythonOptions) -> str:
    """``ResolveToolchain``: the named toolchain, or uv / poetry by their lock file, else pip."""
    if opts.toolchain:
        return opts.toolchain
    if _searchup(opts.program_dir, "uv.lock"):
        return "uv"
    if _searchup(opts.program_dir, "poetry.lock"):
        return "poetry"
    return "pip"


def virtualenv_path(opts: PythonOptions) -> str:
    """The named virtualenv, relative to the project root (where Pulumi.yaml is); "" if none."""
    if not opts.virtualenv:
        return ""
    return opts.virtualenv if os.path.isabs(opts.virtualenv) else os.path.join(
        opts.root, opts.virtualenv
    )


def is_virtualenv(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "bin", "python"))


def virtualenv_error(opts: PythonOptions) -> str:
    """The official ``NewVirtualEnvError`` text for a virtualenv option naming no virtualenv."""
    full = virtualenv_path(opts)
    message = "doesn't exist" if not os.path.exists(full) else (
        "doesn't appear to be a virtual environment"
    )
    python = os.path.join(full, "bin", "python")
    commands = (
        f"    1. python3 -m venv {full}\n"
        f"    2. {python} -m pip install --upgrade pip setuptools wheel\n"
        f"    3. {python} -m pip install -r requirements.txt\n"
    )
    return (
        f"The 'virtualenv' option in Pulumi.yaml is set to \"{opts.virtualenv}\", but "
        f"\"{full}\" {message}; run the following commands to create the virtual environment "
        f"and install dependencies into it:\n\n{commands}\n\n"
        "For more information see: "
        "https://www.pulumi.com/docs/intro/languages/python/#virtual-environments"
    )


def activate_virtualenv(env: Mapping[str, str], venv: str) -> dict[str, str]:
    """``ActivateVirtualEnv``: venv/bin first on PATH, VIRTUAL_ENV set, PYTHONHOME dropped."""
    bin_dir = os.path.join(venv, "bin")
    out = {k: v for k, v in env.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    out["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}" if "PATH" in env else bin_dir
    out["VIRTUAL_ENV"] = venv
    return out


def python_command(opts: PythonOptions, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The interpreter that runs the program and its environment, as the pip toolchain has them.

    Only a virtualenv that ``runtime.options.virtualenv`` names is used; without one it is
    ``$PULUMI_PYTHON_CMD`` or ``python3`` / ``python`` from PATH, whatever ``.venv`` lies
    around (the official host does not look for one). The stand-in runs pip only: a project
    whose toolchain is uv or poetry is refused by name rather than run in the wrong
    environment.
    """
    tc = resolve_toolchain(opts)
    if tc != "pip":
        raise HostError(
            f"toolchain {tc} (Pulumi.yaml runtime.options.toolchain, or its lock file) is not "
            "supported by the stand-in pulumi-language-python of pmem-csi-pulumi "
            "(tools/langhost.py): set toolchain: pip and virtualenv"
        )
    venv = virtualenv_path(opts)
    if venv:
        return os.path.join(venv, "bin", "python"), activate_virtualenv(env, venv)
    names = [env["PULUMI_PYTHON_CMD"]] if env.get("PULUMI_PYTHON_CMD") else ["python3", "python"]
    for name in names:
        found = shutil.which(name, path=env.get("PATH", os.defpath))
        if found:
            return found, dict(env)
    quoted = " ".join(f'"{n}"' for n in names)
    raise HostError(
        f"failed to locate any of [{quoted}] on your PATH. "
        "Have you installed Python 3.10 or greater?"
    )


def ensure_virtualenv(opts: PythonOptions, cwd: str, env: Mapping[str, str]) -> None:
    """``EnsureVenv``: a named virtualenv that is missing (or an empty directory) is created.

    As the official pip toolchain does: ``python3 -m venv``, upgrade pip, setuptools and wheel,
    then ``pip install -r requirements.txt`` of the program directory when there is one.
    Progress goes to stderr, which the CLI shows.
    """
    venv = virtualenv_path(opts)
    if not venv or is_virtualenv(venv):
        return
    if os.path.exists(venv):
        if not os.path.isdir(venv):
            raise HostError(
                f"the 'virtualenv' option in Pulumi.yaml is set to \"{venv}\" but it is not a "
                "directory"
            )
        if os.listdir(venv):
            return
    base, _ = python_command(PythonOptions(opts.root, opts.program_dir, toolchain="pip"), env)
    python = os.path.join(venv, "bin", "python")
    steps = [
        ("creating virtual environment at " + repr(venv), [base, "-m", "venv", venv]),
        ("updating pip, setuptools, and wheel",
         [python, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"]),
    ]  # fmt: skip
    if os.path.exists(os.path.join(cwd, "requirements.txt")):
        steps.append(
            ("installing dependencies", [python, "-m", "pip", "install", "-r", "requirements.txt"])
        )
    print("Creating virtual environment...", file=sys.stderr, flush=True)
    for what, cmd in steps:
        done = subprocess.run(
            cmd, cwd=cwd, env=activate_virtualenv(env, venv), stdout=sys.stderr, check=False
        )
        if done.returncode != 0:
            raise HostError(f"{what} via '{' '.join(cmd)}': exit status {done.returncode}")
    print("Finished installing dependencies", file=sys.stderr, flush=True)


def normalize_name(name: str) -> str:
    """PEP 503 names, as the official host compares packages."""
    return re.sub(r"[-_.]+", "-", name).lower()


# One interpreter start that does what the official host does with two (``pip list --format
# json``, then its pulumi-plugin.json lookup script): every installed distribution, first on
# sys.path wins as in pip, with the path of the pulumi-plugin.json of its top-level package.
_PACKAGES_SCRIPT = r"""
import importlib.metadata, importlib.util, json, os, re, sys
seen, out = set(), []
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if not name:
        continue
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    seen.add(key)
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
        locs = list(spec.submodule_search_locations or []) if spec else []
    except Exception:
        locs = []
    found = [p for l in locs for p in [os.path.join(str(l), "pulumi-plugin.json")]
             if os.path.isfile(p)]
    out.append([key, dist.version, found[0] if found else ""])
print(json.dumps(out))
"""


def installed_packages(python: str, env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(normalized name, version, pulumi-plugin.json path or "") of each installed package."""
    done = subprocess.run(
        [python, "-c", _PACKAGES_SCRIPT], env=dict(env), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise HostError(f"listing the packages of {python} failed: {done.stderr.strip()}")
    return [tuple(row) for row in json.loads(done.stdout)]  # type: ignore[misc]


def plugin_version(package_version: str) -> str:
    """``determinePluginVersion``: a PEP 440 package version as the plugin's semver.

    1.0 -> 1.0.0, 1.2.3a4 -> 1.2.3-alpha.4, 1.2.3rc4 -> 1.2.3-rc.4, 1.2.3.post4.dev5 ->
    1.2.3+post4dev5; anything else (epochs, local versions) raises ValueError.
    """
    m = re.fullmatch(
        r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d*))?(?:\.post(\d*))?(?:\.dev(\d*))?", package_version
    )
    if not package_version or m is None:
        raise ValueError(f"cannot translate package version {package_version!r}")
    release, pre, pre_n, post, dev = m.groups()
    segments = release.split(".")
    segments += ["0"] * (3 - len(segments))
    out = ".".join(segments)
    if pre:
        out += "-" + {"a": "alpha", "b": "beta", "rc": "rc"}[pre] + "." + pre_n
    if post is not None:
        out += "+post" + post
    if dev is not None:
        out += ("" if post is not None else "+") + "dev" + dev
    return out


def package_dependency(
    name: str, version: str, plugin_json: Mapping[str, Any] | None
) -> tuple[str, str, str, Any, Any] | None:
    """``packageDependencyFromPluginJSON``: (name, version, server, parameterization,
    extension) of a package's resource plugin, or None when it has none (or no usable version).

    A package counts when it has a pulumi-plugin.json or its name starts with ``pulumi-``.
    """
    if name in PACKAGES_WITHOUT_PLUGINS:
        return None
    if plugin_json is None and not name.startswith("pulumi-"):
        return None
    data = plugin_json or {}
    if plugin_json is not None and not data.get("resource"):
        return None
    plugin_name = data.get("name") or name.removeprefix("pulumi-")
    plugin = data.get("version") or ""
    if not plugin:
        try:
            plugin = plugin_version(version)
        except ValueError:
            return None
    if not plugin.startswith("v"):
        plugin = "v" + plugin
    return (
        plugin_name,
        plugin,
        data.get("server") or "",
        data.get("parameterization"),
        data.get("extensionParameterization"),
    )


def required_packages(
    opts: PythonOptions, env: Mapping[str, str]
) -> list[tuple[str, str, str, Any, Any]]:
    """What ``GetRequiredPackages`` answers: the resource plugin of each installed package."""
    python, python_env = python_command(opts, env)
    result = []
    for name, version, path in installed_packages(python, python_env):
        plugin_json = None
        if path:
            try:
                plugin_json = json.loads(Path(path).read_text())
            except OSError:
                plugin_json = None
            except ValueError as err:
                raise HostError(f"failed to parse pulumi-plugin.json for {name}: {err}") from err
        dep = package_dependency(name, version, plugin_json)
        if dep is not None:
            result.append(dep)
    return result


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
    if req.config:  # an empty map is nil in Go: the official host then sets no PULUMI_CONFIG
        env["PULUMI_CONFIG"] = json.dumps(dict(sorted(req.config.items())))
    env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(list(req.configSecretKeys))
    return env


def exit_status_response(returncode: int, program: str = "program") -> tuple[str, bool]:
    """(error, bail) for the executor's exit status, as the official plugin answers.

    ``program`` is how the message names it: the official Node.js host writes ``Program``
    (tools/langhost_nodejs.py), the Python one ``program``; the rules are the same.
    """
    if returncode == 0:
        return "", False
    if returncode == USER_ACTIONABLE_EXIT:
        return "", True
    if returncode < 0:
        return f"{program} exited unexpectedly (signal {-returncode})", False
    return f"{program} exited with non-zero exit code: {returncode}", False


class RunningPrograms:
    """The programs a host's ``Run`` started and that have not ended yet.

    A base of both stand-in hosts' servicers: a stop signal to the host, or the CLI cancelling
    one ``Run`` call, interrupts the program (SIGINT) as the official hosts do, so that it can
    finish its Pulumi operations instead of being killed half-way.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()

    def interrupt_all(self) -> None:
        with self._lock:
            for proc in self._running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)

    def wait_for(self, proc: subprocess.Popen[bytes], context: Any) -> int:
        """``proc``'s exit status; interrupted if the gRPC call ``context`` ends first."""
        with self._lock:
            self._running.add(proc)
        context.add_callback(lambda: proc.poll() is None and proc.send_signal(signal.SIGINT))
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)


def plugin_command(
    req: Any, opts: PythonOptions, env: Mapping[str, str]
) -> tuple[list[str], str, dict[str, str]]:
    """(argv, cwd, environment) that ``RunPlugin`` starts, as the official host builds them.

    ``python <plugin directory> <args...>`` (the plugin's ``__main__.py``; the CLI passes the
    engine address as the first argument) with the plugin's interpreter (its virtualenv,
    activated), in the CLI's working directory, with the request's ``KEY=VALUE`` environment
    on top. A policy pack (kind ``analyzer``) and a plugin without ``__main__.py`` (the
    official host's ``pulumi.run.plugin`` mode for a buildable ``pyproject.toml``) are
    refused by name: the stand-in serves component providers only.
    """
    if req.kind == ANALYZER_KIND:
        raise HostError(
            "policy packs are not supported by the stand-in pulumi-language-python of "
            "pmem-csi-pulumi (tools/langhost.py)"
        )
    program_dir = req.info.program_directory
    if not os.path.isfile(os.path.join(opts.root or program_dir, "__main__.py")):
        raise HostError(
            f"plugin {program_dir} has no __main__.py; the stand-in pulumi-language-python of "
            "pmem-csi-pulumi (tools/langhost.py) runs only plugins that provide one"
        )
    venv = virtualenv_path(opts)
    if venv and not is_virtualenv(venv):
        raise HostError(virtualenv_error(opts))
    python, python_env = python_command(opts, env)
    for entry in req.env:
        key, _, value = entry.partition("=")
        python_env[key] = value
    return [python, program_dir, *req.args], req.pwd or program_dir, python_env


def plugin_exit_code(returncode: int) -> int | None:
    """The ``RunPluginResponse.exitcode`` the official host sends; None: none (exit 0).

    Go's ``WaitStatus.ExitStatus()`` is -1 for a process ended by a signal.
    """
    if returncode == 0:
        return None
    return returncode if returncode > 0 else -1


def install_dependencies_steps(
    opts: PythonOptions, env: Mapping[str, str]
) -> list[tuple[str, list[str]]]:
    """The commands ``InstallDependencies`` runs: the pip toolchain's ``InstallDependencies``.

    A missing virtualenv is created first (``python3 -m venv``, then pip, setuptools and wheel
    upgraded), then ``pip install -r requirements.txt`` of the program (or plugin) directory
    when it has one. The stand-in has no ``pyproject.toml`` mode (the official host installs
    a buildable plugin package with ``pip install .``).
    """
    steps: list[tuple[str, list[str]]] = []
    venv = virtualenv_path(opts)
    if venv and not is_virtualenv(venv):
        base, _ = python_command(
            PythonOptions(opts.root, opts.program_dir, toolchain="pip"), env
        )
        python = os.path.join(venv, "bin", "python")
        steps += [
            ("creating virtual environment at " + repr(venv), [base, "-m", "venv", venv]),
            ("updating pip, setuptools, and wheel",
             [python, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"]),
        ]  # fmt: skip
    else:
        python, _ = python_command(opts, env)
    if os.path.exists(os.path.join(opts.program_dir, "requirements.txt")):
        steps.append(
            ("installing dependencies", [python, "-m", "pip", "install", "-r", "requirements.txt"])
        )
    return steps


def stream_process(
    cmd: Sequence[str], cwd: str, env: Mapping[str, str], on_start: Any = None
) -> Iterator[tuple[str, bytes | int]]:
    """Run ``cmd`` and yield ``("stdout"|"stderr", chunk)`` as it writes, then ``("exit", rc)``.

    The CLI reads a plugin's port from its stdout as soon as it is printed, so output is
    passed on chunk by chunk, never buffered until the end. ``on_start(proc)`` lets the
    caller stop the process when the CLI cancels the call.
    """
    import queue

    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    if on_start is not None:
        on_start(proc)
    chunks: queue.Queue[tuple[str, bytes]] = queue.Queue()

    def pump(name: str, stream: Any) -> None:
        while True:
            data = os.read(stream.fileno(), 65536)
            if not data:
                break
            chunks.put((name, data))
        chunks.put((name, b""))

    for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        threading.Thread(target=pump, args=(name, stream), daemon=True).start()
    open_streams = 2
    while open_streams:
        name, data = chunks.get()
        if not data:
            open_streams -= 1
            continue
        yield name, data
    yield "exit", proc.wait()


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


_ABOUT_SCRIPT = (
    "import sys, json\n"
    "try:\n    import pip; v = pip.__version__\nexcept Exception:\n    v = ''\n"
    "print(json.dumps([sys.executable, '.'.join(map(str, sys.version_info[:3])), v]))"
)


def about(opts: PythonOptions, env: Mapping[str, str]) -> tuple[str, str, dict[str, str]]:
    """(executable, version, metadata) of the program's interpreter, as ``About`` reports."""
    python, python_env = python_command(opts, env)
    done = subprocess.run(
        [python, "-c", _ABOUT_SCRIPT], env=python_env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise HostError(f"failed to get python executable path: {done.stderr.strip()}")
    executable, version, pip_version = json.loads(done.stdout)
    return executable, version, {
        "toolchain": opts.toolchain.capitalize() if opts.toolchain else "Auto",
        "toolchainVersion": pip_version,
        "typechecker": opts.typechecker.capitalize() if opts.typechecker else "None",
    }


def typecheck_command(opts: PythonOptions, python: str) -> list[str]:
    """The typechecker run before the program when ``runtime.options.typechecker`` is set."""
    if not opts.typechecker:
        return []
    cmd = [python, "-m", opts.typechecker]
    if opts.typechecker == "mypy":
        venv = virtualenv_path(opts)
        cmd += ["--exclude", os.path.relpath(venv or ".", opts.program_dir)]
    return [*cmd, opts.program_dir]


def make_servicer(args: HostArgs, executor: Path) -> Any:
    """The LanguageRuntime servicer (built here so importing this module needs no SDK)."""
    import grpc
    from google.protobuf import json_format

    language_pb2, language_pb2_grpc, plugin_pb2 = _import_protos()

    def options_of(info: Any, context: Any, *, is_plugin: bool = False) -> PythonOptions:
        """Parsed options; a bad one aborts the call as the official host's error does."""
        raw = json_format.MessageToDict(info.options) if info.HasField("options") else {}
        try:
            return parse_options(
                info.root_directory, info.program_directory, raw, is_plugin=is_plugin
            )
        except HostError as err:
            context.abort(grpc.StatusCode.UNKNOWN, str(err))
            raise  # not reached: abort raises

    def parameterization(value: Any) -> Any:
        if not value:
            return None
        return plugin_pb2.PackageParameterization(
            name=value.get("name", ""),
            version=value.get("version", ""),
            value=base64.b64decode(value.get("value", "")),
        )

    class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer, RunningPrograms):
        def GetPluginInfo(self, request: Any, context: Any) -> Any:
            return plugin_pb2.PluginInfo(version=_sdk_version())

        def GetRequiredPlugins(self, request: Any, context: Any) -> Any:
            # As the official host: unimplemented, so the CLI asks GetRequiredPackages.
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "method GetRequiredPlugins not implemented"
            )

        def GetRequiredPackages(self, request: Any, context: Any) -> Any:
            opts = options_of(request.info, context)
            try:
                ensure_virtualenv(opts, request.info.program_directory, os.environ)
                found = required_packages(opts, os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            packages = [
                plugin_pb2.PackageDependency(
                    name=name,
                    version=version,
                    kind="resource",
                    server=server,
                    parameterization=parameterization(param),
                    extension=parameterization(ext),
                )
                for name, version, server, param, ext in found
            ]
            return language_pb2.GetRequiredPackagesResponse(packages=packages)

        def About(self, request: Any, context: Any) -> Any:
            # Without program info (older CLIs) the official host uses the plain pip toolchain.
            if request.HasField("info"):
                opts = options_of(request.info, context)
            else:
                opts = PythonOptions(root="", program_dir="", toolchain="pip")
            try:
                executable, version, metadata = about(opts, os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            return language_pb2.AboutResponse(
                executable=executable, version=version, metadata=metadata
            )

        def Cancel(self, request: Any, context: Any) -> Any:
            from google.protobuf import empty_pb2

            self.interrupt_all()
            return empty_pb2.Empty()

        def RunPlugin(self, req: Any, context: Any) -> Iterator[Any]:
            # A plugin written in Python (here: a component provider, PulumiPlugin.yaml with
            # runtime python): its __main__.py in its virtualenv, output streamed to the CLI,
            # which reads the provider's port from the first stdout line.
            opts = options_of(req.info, context, is_plugin=req.kind != ANALYZER_KIND)
            try:
                cmd, cwd, env = plugin_command(req, opts, os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))

            def on_start(proc: subprocess.Popen[bytes]) -> None:
                # The CLI stops a plugin by cancelling this call (the official host's
                # exec.CommandContext then kills it). Not in self._running: the official host's
                # Cancel (and so interrupt_all) is for programs only, and a set of every plugin
                # ever run would grow for the host's lifetime.
                context.add_callback(lambda: proc.poll() is None and proc.kill())

            response = language_pb2.RunPluginResponse
            try:
                for name, data in stream_process(cmd, cwd, env, on_start):
                    if name == "exit":
                        code = plugin_exit_code(int(data))  # type: ignore[arg-type]
                        if code is not None:
                            yield response(exitcode=code)
                    elif name == "stdout":
                        yield response(stdout=data)
                    else:
                        yield response(stderr=data)
            except OSError as err:
                context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"problem executing plugin program (could not run language executor): {err}",
                )

        def InstallDependencies(self, req: Any, context: Any) -> Iterator[Any]:
            # `pulumi install`, and `pulumi package add` for a Python plugin (is_plugin).
            opts = options_of(req.info, context, is_plugin=req.is_plugin)
            response = language_pb2.InstallDependenciesResponse
            yield response(stdout=b"Installing dependencies...\n\n")
            try:
                steps = install_dependencies_steps(opts, os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            venv = virtualenv_path(opts)
            for what, cmd in steps:
                env = activate_virtualenv(os.environ, venv) if venv else dict(os.environ)
                code = 0
                for name, data in stream_process(cmd, opts.program_dir or ".", env):
                    if name == "exit":
                        code = int(data)  # type: ignore[arg-type]
                    elif name == "stdout":
                        yield response(stdout=data)
                    else:
                        yield response(stderr=data)
                if code != 0:
                    context.abort(
                        grpc.StatusCode.UNKNOWN,
                        f"{what} via '{' '.join(cmd)}': exit status {code}",
                    )
            yield response(stdout=b"Finished installing dependencies\n\n")

        def Run(self, req: Any, context: Any) -> Any:
            opts = options_of(req.info, context)
            if virtualenv_path(opts) and not is_virtualenv(virtualenv_path(opts)):
                context.abort(grpc.StatusCode.UNKNOWN, virtualenv_error(opts))
            try:
                python, env = python_command(opts, os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            typecheck = typecheck_command(opts, python)
            if typecheck:
                done = subprocess.run(
                    typecheck, cwd=opts.program_dir or None, env=env, capture_output=True,
                    text=True,
                )  # fmt: skip
                sys.stdout.write(done.stdout)
                sys.stderr.write(done.stderr)
                if done.returncode != 0:
                    context.abort(
                        grpc.StatusCode.UNKNOWN,
                        f"{opts.typechecker} failed: exit status {done.returncode}\n"
                        f"{done.stdout}{done.stderr}",
                    )
            cmd = [
                *QUIET_START,
                python,
                "-u",
                str(executor),
                *executor_arguments(req, args.engine_address, args.tracing),
            ]
            # stdout/stderr are inherited: the CLI shows the program's prints as diagnostics.
            # The working directory is the host's, as with the official host (the executor
            # changes to --pwd itself).
            try:
                proc = subprocess.Popen(cmd, env=executor_environment(req, env))
            except OSError as err:
                return language_pb2.RunResponse(
                    error=f"problem executing program (could not run language executor): {err}"
                )
            returncode = self.wait_for(proc, context)
            sys.stdout.flush()
            error, bail = exit_status_response(returncode)
            return language_pb2.RunResponse(error=error, bail=bail)

    return LanguageHost()


# When set, the name of every RPC the CLI calls is appended to this file (one line each):
# which calls a CLI command makes is otherwise visible only in the CLI's verbose logs.
CALL_LOG_ENV = "PMEM_CSI_LANGHOST_CALL_LOG"


def call_logger(path: str, prefix: str = "") -> Any:
    """A gRPC interceptor appending ``<prefix><RPC name>`` per call to ``path``.

    Both stand-in hosts (this one and tools/langhost_nodejs.py, prefix ``nodejs:``) write to
    the one file CALL_LOG_ENV names, so a test sees which host the CLI asked what, in order.
    """
    import grpc

    class CallLogger(grpc.ServerInterceptor):  # type: ignore[misc]
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            with open(path, "a") as log:
                log.write(prefix + details.method.rsplit("/", 1)[-1] + "\n")
            return continuation(details)

    return CallLogger()


def serve_language_host(
    make_servicer: Callable[[], Any], *, max_workers: int, call_log_prefix: str = ""
) -> int:
    """Serve the servicer ``make_servicer`` returns on a free port of 127.0.0.1, print the port,
    stop on SIGINT/SIGTERM or once the CLI that started us is gone.

    Shared by both stand-in hosts: how the CLI starts and stops a language plugin does not
    depend on the language. ``make_servicer`` is called once the stop handlers are in.
    """
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
    servicer = make_servicer()
    running.append(servicer)
    interceptors = []
    if os.environ.get(CALL_LOG_ENV):
        interceptors.append(call_logger(os.environ[CALL_LOG_ENV], call_log_prefix))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
        interceptors=interceptors,
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


def serve(args: HostArgs) -> int:
    executor = Path(args.executor) if args.executor else Path(__file__).with_name(EXECUTOR_NAME)
    if not executor.exists():
        print(f"missing executor {executor}", file=sys.stderr)
        return 1
    # A RunPlugin call holds its thread while the plugin runs (a YAML program with several
    # Python component packages, each with its provider): room for many.
    return serve_language_host(lambda: make_servicer(args, executor), max_workers=64)


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

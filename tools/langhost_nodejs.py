#!/usr/bin/env python3
"""A stand-in for the ``pulumi-language-nodejs`` plugin, for machines that cannot install it.

Why it exists: the CLI generates, links and runs a TypeScript program's SDKs through the
``pulumi-language-nodejs`` plugin it finds on PATH, and the Go module proxy these machines reach
does not serve that plugin's module. This file does the plugin's job for what
``docs/yaml-and-other-languages.md`` promises a TypeScript user (``pulumi package add`` of the
component provider, ``preview``, ``up``, ``destroy``), reusing the gRPC server parts of the
stand-in Python host (``tools/langhost.py``). A normal Pulumi install has the official plugin
and never uses this file.

What it serves, as the official host (``sdk/nodejs/cmd/pulumi-language-nodejs``) does:

- ``GeneratePackage``: the CLI's own TypeScript code generator, run by
  ``pulumi-nodejs-codegen`` (``tools/pulumi-nodejs/main.go``, built from the CLI's module),
  which binds the schema and writes the files;
- ``Link``: ``npm pkg set dependencies.<package>=file:<path>`` in the program directory, and
  the package's ``file:`` spec added to ``allowScripts`` (the local SDK's ``postinstall``
  compiles it); the answer is the official import instruction. The package name is the one the
  generated SDK's ``package.json`` carries (the code generator derives both from the schema);
- ``InstallDependencies``: ``npm install --loglevel=error`` in the program directory, output
  streamed;
- ``Run``: ``node <@pulumi/pulumi/cmd/run> --monitor .. --engine .. --project .. --stack ..
  --pwd .. [--dry-run] --parallel N <entry point>`` from the program directory, with
  ``PULUMI_CONFIG`` (keys as ``<namespace>:config:<name>``) and ``PULUMI_CONFIG_SECRET_KEYS``;
  exit code 32 is answered with ``bail``. The monitor address is passed through (the official
  host puts a forwarding proxy in between) and no ``--sync`` pipes are offered (only the
  deprecated synchronous invokes use them);
- ``GetRequiredPackages``: the resource plugin of every package under ``node_modules`` whose
  ``package.json`` has ``pulumi.resource: true`` (the official host's rule);
- ``GetPluginInfo`` (this host's version), ``Cancel`` (interrupts running programs);
  ``GetRequiredPlugins`` is unimplemented, as in the official host.

``runtime.options`` read: ``typescript``, ``tsconfig``, ``nodeargs``, ``production`` and
``packagemanager`` (only ``npm``: ``yarn``, ``pnpm`` and ``bun`` are refused by name).
``PMEM_CSI_LANGHOST_CALL_LOG`` logs every RPC's name, as
``tools/langhost.py`` does. :func:`install` writes the launcher ``pulumi-language-nodejs``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

VERSION = "3.276.0"  # the CLI's, whose code generator this host runs
CODEGEN_ENV = "PMEM_CSI_NODEJS_CODEGEN"
CODEGEN_BINARY = "pulumi-nodejs-codegen"
HOST_NAME = "pulumi-language-nodejs"
HOST_FILE = "pulumi-language-nodejs-host"
SHARED_FILE = "pulumi_langhost_shared.py"
RUN_MODULE = "@pulumi/pulumi/cmd/run"
PACKAGE_MANAGERS = ("npm", "yarn", "pnpm", "bun")


def _shared() -> ModuleType:
    """tools/langhost.py: imported as ``tools.langhost`` in the checkout, else from the copy
    :func:`install` puts next to this file (the host runs standalone, outside the checkout)."""
    here = Path(__file__).resolve()
    for candidate in (here.with_name("langhost.py"), here.with_name(SHARED_FILE)):
        if candidate.is_file():
            spec = importlib.util.spec_from_file_location("pmem_csi_langhost_shared", candidate)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up there
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"neither langhost.py nor {SHARED_FILE} next to {here}")


langhost = _shared()
HostError = langhost.HostError
CALL_LOG_ENV = langhost.CALL_LOG_ENV


@dataclass(frozen=True)
class NodeOptions:
    """``runtime.options`` of Pulumi.yaml as the official host reads them (``parseOptions``)."""

    typescript: bool = True
    tsconfig: str = ""
    nodeargs: str = ""
    production: bool = False
    packagemanager: str = "auto"


# (option, type, message) in the official host's order and wording.
_OPTION_TYPES: tuple[tuple[str, type, str], ...] = (
    ("typescript", bool, "typescript option must be a boolean"),
    ("tsconfig", str, "tsconfigpath option must be a string"),
    ("nodeargs", str, "nodeargs option must be a string"),
    ("production", bool, "production option must be a boolean"),
    ("packagemanager", str, "packagemanager option must be a string"),
)
# The lock files by which the official host's "auto" picks another package manager.
_OTHER_LOCK_FILES = {"yarn.lock": "yarn", "pnpm-lock.yaml": "pnpm", "bun.lock": "bun",
                     "bun.lockb": "bun"}  # fmt: skip


def parse_options(options: Mapping[str, Any]) -> NodeOptions:
    """Read the runtime options, refusing wrong types and values with the official messages."""
    fields: dict[str, Any] = {}
    for key, typ, message in _OPTION_TYPES:
        if key in options:
            if not isinstance(options[key], typ):
                raise HostError(message)
            fields[key] = options[key]
    pm = fields.get("packagemanager", "auto")
    if pm not in ("auto", *PACKAGE_MANAGERS):
        raise HostError(
            "packagemanager option must be one of auto, npm, yarn, pnpm or bun, got "
            + json.dumps(pm)  # Go's %q
        )
    return NodeOptions(**fields)


def package_manager(opts: NodeOptions, program_dir: str) -> str:
    """The package manager: the stand-in runs npm only, so yarn, pnpm and bun (named, or
    chosen by "auto" from their lock file, as the official host does) are refused by name."""
    chosen = opts.packagemanager
    if chosen == "auto":
        chosen = next(
            (pm for lock, pm in _OTHER_LOCK_FILES.items() if Path(program_dir, lock).exists()),
            "npm",
        )
    if chosen != "npm":
        raise HostError(
            f"packagemanager {chosen} (Pulumi.yaml runtime.options.packagemanager, or its lock "
            "file) is not supported by the stand-in pulumi-language-nodejs of pmem-csi-pulumi "
            "(tools/langhost_nodejs.py): use npm"
        )
    return chosen


def codegen_binary(env: Mapping[str, str]) -> str:
    """The code generator: ``$PMEM_CSI_NODEJS_CODEGEN``, else ``pulumi-nodejs-codegen`` on PATH."""
    named = env.get(CODEGEN_ENV) or shutil.which(CODEGEN_BINARY, path=env.get("PATH"))
    if not named or not os.path.isfile(named):
        raise HostError(
            f"{CODEGEN_BINARY} not found ({CODEGEN_ENV} or PATH): build it with "
            "`python -m tools.toolchain build pulumi-nodejs`"
        )
    return named


def generate_package(request: bytes, env: Mapping[str, str]) -> bytes:
    """Run the code generator on a serialized GeneratePackageRequest; the serialized response."""
    done = subprocess.run(
        [codegen_binary(env)], input=request, capture_output=True, env=dict(env), check=False
    )
    if done.returncode != 0:
        raise HostError(done.stderr.decode(errors="replace").strip() or "code generation failed")
    return done.stdout


def linked_package_name(program_dir: str, sdk_path: str) -> str:
    """The npm name of the SDK at ``sdk_path`` (relative to the program), from its package.json."""
    manifest = Path(program_dir, sdk_path, "package.json")
    try:
        name = json.loads(manifest.read_text())["name"]
    except (OSError, ValueError, KeyError) as err:
        raise HostError(f"cannot read the package name of the SDK at {sdk_path}: {err}") from err
    if not isinstance(name, str) or not name:
        raise HostError(f"the SDK at {sdk_path} has no package name in {manifest}")
    return name


def link_commands(package: str, sdk_path: str, allow_scripts: Mapping[str, Any]) -> list[list[str]]:
    """The npm commands that link one SDK: the dependency, then its entry in ``allowScripts``."""
    allowed = {**allow_scripts, f"file:{sdk_path}": True}
    return [
        ["npm", "pkg", "set", f"dependencies.{package}=file:{sdk_path}"],
        ["npm", "pkg", "set", "--json", f"allowScripts={json.dumps(allowed)}"],
    ]


def current_allow_scripts(program_dir: str) -> dict[str, Any]:
    """``allowScripts`` of the program's package.json ({} when absent or not an object)."""
    try:
        value = json.loads(Path(program_dir, "package.json").read_text()).get("allowScripts")
    except (OSError, ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) else {}


def import_instructions(packages: Sequence[tuple[str, str]], typescript: bool) -> str:
    """The official answer of ``Link``: one import (or require) line per (schema name, npm name)."""
    lines = [
        f'  import * as {_camel(name)} from "{npm}";\n'
        if typescript
        else f'  const {_camel(name)} = require("{npm}");\n'
        for name, npm in packages
    ]
    kind = "TypeScript" if typescript else "JavaScript"
    return f"You can import the SDK in your {kind} code with:\n\n" + "".join(lines)


def link_packages(program_dir: str, packages: Sequence[tuple[str, str]]) -> str:
    """``Link``: each (schema name, SDK path) becomes a ``file:`` dependency of the program
    (``npm pkg set``, as the official npm manager does); the answer is the import instruction."""
    require_npm(os.environ)
    linked = []
    for schema_name, sdk_path in packages:
        npm_name = linked_package_name(program_dir, sdk_path)
        for cmd in link_commands(npm_name, sdk_path, current_allow_scripts(program_dir)):
            done = subprocess.run(cmd, cwd=program_dir, capture_output=True, text=True)
            if done.returncode != 0:
                raise HostError(
                    f"error executing npm command {' '.join(cmd)}: exit status "
                    f"{done.returncode}, output: {done.stdout}{done.stderr}"
                )
        linked.append((schema_name, npm_name))
    return import_instructions(linked, is_typescript(program_dir))


def _camel(name: str) -> str:
    """``cgstrings.Camel``: pmem-csi -> pmemCsi."""
    parts = [p for p in name.replace("_", "-").split("-") if p]
    return parts[0][:1].lower() + parts[0][1:] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def is_typescript(program_dir: str) -> bool:
    """A TypeScript project: a tsconfig.json in the program directory or above (official rule)."""
    current = Path(program_dir).absolute()
    return any((d / "tsconfig.json").exists() for d in (current, *current.parents))


def run_arguments(req: Any, run_path: str, engine_address: str, tracing: str) -> list[str]:
    """The command line of ``node`` for one RunRequest (the official host's flags, in order)."""
    args = [run_path]

    def add(flag: str, value: str) -> None:
        if value:
            args.extend([f"--{flag}", value])

    add("monitor", req.monitor_address)
    add("engine", engine_address)
    add("organization", req.organization)
    add("project", req.project)
    add("root-directory", req.info.root_directory)
    add("stack", req.stack)
    add("pwd", req.info.program_directory)
    if req.dryRun:
        args.append("--dry-run")
    add("parallel", str(req.parallel))
    add("tracing", tracing)
    args.append(req.info.entry_point or ".")
    args.extend(req.args)
    return args


def run_environment(req: Any, opts: NodeOptions, base: Mapping[str, str]) -> dict[str, str]:
    """The program's environment: config keys in the old ``<ns>:config:<name>`` form, as the
    official host passes them, the secret keys as given, and the TypeScript options that
    ``@pulumi/pulumi``'s run reads (``PULUMI_NODEJS_TYPESCRIPT``, ``..._TSCONFIG_PATH``)."""
    config = {}
    for key, value in req.config.items():
        namespace, sep, name = key.partition(":")
        if not sep:
            raise HostError(f"config key {key!r} has no namespace")
        config[f"{namespace}:config:{name}"] = value
    env = {
        **base,
        "PULUMI_CONFIG": json.dumps(config),
        "PULUMI_CONFIG_SECRET_KEYS": json.dumps(list(req.configSecretKeys)),
    }
    if opts.typescript:
        env["PULUMI_NODEJS_TYPESCRIPT"] = "true"
    if opts.tsconfig:
        env["PULUMI_NODEJS_TSCONFIG_PATH"] = opts.tsconfig
    return env


def require_npm(env: Mapping[str, str]) -> None:
    """A missing npm named as such, not a bare ``FileNotFoundError`` from the gRPC call."""
    if shutil.which("npm", path=env.get("PATH")) is None:
        raise HostError("could not find npm on the $PATH: install Node.js with npm")


def install_command(opts: NodeOptions) -> list[str]:
    """npm's install command as the official host runs it (``--production`` when asked)."""
    return ["npm", "install", "--loglevel=error", *(["--production"] if opts.production else [])]


def locate_run_module(program_dir: str, env: Mapping[str, str]) -> str:
    """``@pulumi/pulumi/cmd/run`` as node resolves it from the program directory."""
    node = shutil.which("node", path=env.get("PATH"))
    if node is None:
        raise HostError("could not find node on the $PATH")
    done = subprocess.run(
        [node, "-e", f"console.log(require.resolve({json.dumps(RUN_MODULE)}))"],
        cwd=program_dir or None, env=dict(env), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise HostError(
            f"It looks like the Pulumi SDK has not been installed. Have you run npm install? "
            f"({RUN_MODULE} not found from {program_dir})"
        )
    return done.stdout.strip()


def plugin_of(manifest: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(plugin name, version, server) of a package.json with ``pulumi.resource``, else None.

    As the official ``getPackageInfo``: the name is ``pulumi.name``, or the package name without
    its ``@pulumi/`` scope (a third-party package without ``pulumi.name`` is skipped, the
    official host logs it); the version is ``pulumi.version`` or the package's, with a ``v``.
    """
    info = manifest.get("pulumi")
    if not isinstance(info, dict) or not info.get("resource"):
        return None
    name = info.get("name") or ""
    package = str(manifest.get("name") or "")
    if not name and package.startswith("@pulumi/"):
        name = package.split("/", 1)[1]
    version = str(info.get("version") or manifest.get("version") or "")
    if not name or not version:
        return None
    return name, version if version.startswith("v") else "v" + version, info.get("server") or ""


def required_packages(program_dir: str) -> list[tuple[str, str, str]]:
    """What ``GetRequiredPackages`` answers: the official ``getPackagesFromDir`` walk.

    Every directory under the program directory, symlinks followed (each real directory once);
    a ``package.json`` counts only inside a ``node_modules`` tree.
    """
    found: list[tuple[str, str, str]] = []
    visited: set[str] = set()

    def walk(directory: str, in_node_modules: bool) -> None:
        real = os.path.realpath(directory)
        if real in visited:
            return
        visited.add(real)
        try:
            entries = sorted(os.scandir(real), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir():  # follows symlinks
                walk(entry.path, in_node_modules or os.path.basename(real) == "node_modules")
            elif in_node_modules and entry.name == "package.json":
                try:
                    manifest = json.loads(Path(entry.path).read_text())
                except (OSError, ValueError):
                    continue
                plugin = plugin_of(manifest) if isinstance(manifest, dict) else None
                if plugin is not None:
                    found.append(plugin)

    walk(program_dir, False)
    return found


def exit_status_response(returncode: int) -> tuple[str, bool]:
    """(error, bail) for node's exit status, as the official host answers: the Python host's
    rules (its nodeJSProcessExitedAfterShowingUserActionableMessage is also 32), ``Program``."""
    return langhost.exit_status_response(returncode, "Program")


def make_servicer(args: Any) -> Any:
    """The LanguageRuntime servicer (built here so importing this module needs no SDK)."""
    import grpc
    from google.protobuf import empty_pb2, json_format

    language_pb2, language_pb2_grpc, plugin_pb2 = langhost._import_protos()

    def options_of(info: Any) -> NodeOptions:
        """The parsed options, checked for the package manager (only npm is served)."""
        raw = json_format.MessageToDict(info.options) if info.HasField("options") else {}
        opts = parse_options(raw)
        package_manager(opts, info.program_directory)
        return opts

    class NodeLanguageHost(language_pb2_grpc.LanguageRuntimeServicer, langhost.RunningPrograms):
        def GetPluginInfo(self, request: Any, context: Any) -> Any:
            return plugin_pb2.PluginInfo(version=VERSION)

        def GetRequiredPlugins(self, request: Any, context: Any) -> Any:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "method GetRequiredPlugins not implemented"
            )

        def GetRequiredPackages(self, request: Any, context: Any) -> Any:
            packages = [
                plugin_pb2.PackageDependency(name=n, version=v, kind="resource", server=s)
                for n, v, s in required_packages(request.info.program_directory)
            ]
            return language_pb2.GetRequiredPackagesResponse(packages=packages)

        def GeneratePackage(self, request: Any, context: Any) -> Any:
            try:
                answer = generate_package(request.SerializeToString(), os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            return language_pb2.GeneratePackageResponse.FromString(answer)

        def Link(self, request: Any, context: Any) -> Any:
            program_dir = request.info.program_directory
            try:
                options_of(request.info)
                text = link_packages(
                    program_dir, [(dep.package.name, dep.path) for dep in request.packages]
                )
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            return language_pb2.LinkResponse(import_instructions=text)

        def InstallDependencies(self, req: Any, context: Any) -> Iterator[Any]:
            response = language_pb2.InstallDependenciesResponse
            try:
                opts = options_of(req.info)
                require_npm(os.environ)
            except HostError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            yield response(stdout=b"Installing dependencies...\n\n")
            cmd = install_command(opts)
            code = 0
            for name, data in langhost.stream_process(cmd, req.info.program_directory or ".",
                                                      os.environ):  # fmt: skip
                if name == "exit":
                    code = int(data)
                elif name == "stdout":
                    yield response(stdout=data)
                else:
                    yield response(stderr=data)
            if code != 0:
                context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"installing dependencies via '{' '.join(cmd)}': exit status {code}",
                )
            yield response(stdout=b"Finished installing dependencies\n\n")

        def Cancel(self, request: Any, context: Any) -> Any:
            self.interrupt_all()
            return empty_pb2.Empty()

        def Run(self, req: Any, context: Any) -> Any:
            program_dir = req.info.program_directory
            try:
                opts = options_of(req.info)
                run_path = locate_run_module(program_dir, os.environ)
                env = run_environment(req, opts, os.environ)
                node_args = shlex.split(opts.nodeargs)
            except (HostError, ValueError) as err:
                return language_pb2.RunResponse(error=str(err))
            node = shutil.which("node") or "node"
            cmd = [node, *node_args,
                   *run_arguments(req, run_path, args.engine_address, args.tracing)]  # fmt: skip
            try:
                proc = subprocess.Popen(cmd, cwd=program_dir or None, env=env)
            except OSError as err:
                return language_pb2.RunResponse(
                    error=f"Problem executing program (could not run language executor): {err}"
                )
            returncode = self.wait_for(proc, context)
            error, bail = exit_status_response(returncode)
            return language_pb2.RunResponse(error=error, bail=bail)

    return NodeLanguageHost()


# Lines of the call log (CALL_LOG_ENV, shared with the Python host): "nodejs:<RPC name>".
CALL_LOG_PREFIX = "nodejs:"


def serve(args: Any) -> int:
    """Serve on a free port of 127.0.0.1, print it, stop on SIGINT/SIGTERM or an orphaned parent
    (the Python host's loop; the call log's lines ``nodejs:<RPC>``)."""
    return langhost.serve_language_host(
        lambda: make_servicer(args), max_workers=16, call_log_prefix=CALL_LOG_PREFIX
    )


def launcher_text(python: str, host: Path, codegen: Path) -> str:
    """The ``pulumi-language-nodejs`` launcher: this host under ``python`` with the code
    generator named; stderr parked until quiet signal handlers are in (as tools/langhost.sh)."""
    return (
        "#!/bin/sh\n"
        "# pulumi-language-nodejs, the stand-in Node.js language host of pmem-csi-pulumi\n"
        "# (tools/langhost_nodejs.py), written by its install().\n"
        f'{CODEGEN_ENV}="${{{CODEGEN_ENV}:-{codegen}}}" PMEM_CSI_PARKED_STDERR=3 \\\n'
        f'  exec "{python}" "{host}" "$@" 3>&2 2>/dev/null\n'
    )


def install(bin_dir: Path, codegen: Path, python: str = sys.executable) -> Path:
    """Put the launcher, this host and the shared part of tools/langhost.py into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve()
    host = bin_dir / HOST_FILE
    shutil.copyfile(here, host)
    shutil.copyfile(here.with_name("langhost.py"), bin_dir / SHARED_FILE)
    launcher = bin_dir / HOST_NAME
    launcher.write_text(launcher_text(python, host, codegen))
    launcher.chmod(0o755)
    return launcher


def main(argv: Sequence[str] | None = None) -> int:
    args = langhost.parse_argv(sys.argv[1:] if argv is None else argv)
    if args.show_version:
        print(VERSION)
        return 0
    return serve(args)


def _exit_quietly(signum: int, frame: Any) -> None:
    os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.signal(signal.SIGTERM, _exit_quietly)
    langhost.restore_stderr()
    raise SystemExit(main())

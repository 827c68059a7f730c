"""The stand-in language host answers the CLI's RPCs as the official pulumi-language-python does.

What the official host (``sdk/python/cmd/pulumi-language-python/main.go`` and
``sdk/python/toolchain`` of the pinned Pulumi release) does, and these tests hold the stand-in
to, over gRPC exactly as the CLI calls it:

- the interpreter is the virtualenv named by ``runtime.options.virtualenv`` (relative to the
  project root), else ``$PULUMI_PYTHON_CMD`` or ``python3`` from PATH; a ``.venv`` that no
  option names is not used;
- a virtualenv option naming no virtualenv fails ``Run`` with the official message;
- options of the wrong type or value fail with the official messages;
- ``GetRequiredPlugins`` is unimplemented (the CLI then uses ``GetRequiredPackages``), and
  ``GetRequiredPackages`` lists every installed Pulumi package's resource plugin and version
  from its ``pulumi-plugin.json``;
- ``About`` reports the program's interpreter and toolchain, not the host's;
- ``RunPlugin`` starts a plugin's ``__main__.py`` with its virtualenv (``venv`` when its
  ``PulumiPlugin.yaml`` names none), the CLI's arguments, environment and working directory,
  streams its output and ends with its exit code; cancelling the call kills the plugin;
  ``InstallDependencies`` streams the pip toolchain's steps;
- the ``LanguageRuntime`` service of the pinned SDK has the 17 RPCs the host was written
  against (the CLI's, ``sdk/v3`` v3.276.0, has the same); those the host does not serve
  (code generation, conversion, packing, plugins written in Python) answer ``UNIMPLEMENTED``,
  whatever new fields their requests carry (``mapper_target`` of ``GenerateProgram`` and
  ``GenerateProject``, new in 3.261-3.276).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools import langhost, toolchain

grpc = pytest.importorskip("grpc")
from google.protobuf import empty_pb2, struct_pb2  # noqa: E402
from pulumi.runtime.proto import language_pb2, language_pb2_grpc  # noqa: E402

PROJECT_OPTIONS = {"toolchain": "pip", "virtualenv": ".venv"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory with a ``.venv`` (this checkout's) that no option names yet."""
    root = tmp_path_factory.mktemp("project")
    (root / ".venv").symlink_to(toolchain.PROJECT_DIR / ".venv")
    (root / "__main__.py").write_text("")
    return root


@pytest.fixture(scope="module")
def path_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python3`` on the host's PATH: the base interpreter, without the project's packages."""
    bin_dir = tmp_path_factory.mktemp("path-bin")
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (bin_dir / "python3").symlink_to(base)
    return bin_dir / "python3"


@pytest.fixture(scope="module")
def host(
    tmp_path_factory: pytest.TempPathFactory, project: Path, path_python: Path
) -> Iterator[Any]:
    """A running stand-in host, started as the CLI starts it (engine address last)."""
    bin_dir = tmp_path_factory.mktemp("cli-bin")
    toolchain.install_language_host(bin_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("PULUMI_PYTHON_CMD", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(path_python.parent), "/usr/bin", "/bin"])
    # The launcher's python3 (the base one) has no grpc: the host re-executes itself with
    # ./.venv, as it does in a project directory.
    proc = subprocess.Popen(
        [str(bin_dir / "pulumi-language-python"), "127.0.0.1:1"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield language_pb2_grpc.LanguageRuntimeStub(channel)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _info(root: Path, options: dict[str, Any], program: Path | None = None) -> Any:
    opts = struct_pb2.Struct()
    opts.update(options)
    return language_pb2.ProgramInfo(
        root_directory=str(root),
        program_directory=str(program or root),
        entry_point=".",
        options=opts,
    )


def _rpc_error(call: Any, request: Any) -> Any:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=60)
    return caught.value


def test_get_required_plugins_is_unimplemented_as_in_the_official_host(host: Any) -> None:
    err = _rpc_error(
        host.GetRequiredPlugins, language_pb2.GetRequiredPluginsRequest(project="p", pwd="/")
    )
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


def test_required_packages_name_the_kubernetes_plugin_with_its_pinned_version(
    host: Any, project: Path
) -> None:
    resp = host.GetRequiredPackages(
        language_pb2.GetRequiredPackagesRequest(info=_info(project, PROJECT_OPTIONS)), timeout=60
    )
    got = [(p.name, p.version, p.kind, p.server) for p in resp.packages]
    # The project pins pulumi-kubernetes at the provider's version (requirements.txt).
    assert got == [("kubernetes", toolchain.PULUMI_KUBERNETES_VERSION, "resource", "")]
    assert not resp.specs


def test_about_reports_the_named_virtualenv_and_the_toolchain(host: Any, project: Path) -> None:
    about = host.About(language_pb2.AboutRequest(info=_info(project, PROJECT_OPTIONS)), timeout=60)
    assert about.executable == str(project / ".venv" / "bin" / "python")
    assert about.version == ".".join(map(str, sys.version_info[:3]))
    assert about.metadata["toolchain"] == "Pip"
    assert about.metadata["typechecker"] == "None"


def test_a_dotvenv_no_option_names_is_not_used(
    host: Any, project: Path, path_python: Path
) -> None:
    # The official host runs python3 from PATH unless Pulumi.yaml names the virtualenv.
    about = host.About(language_pb2.AboutRequest(info=_info(project, {})), timeout=60)
    assert about.executable == str(path_python)
    assert about.metadata["toolchain"] == "Auto"


def test_run_with_a_named_virtualenv_that_does_not_exist_fails_with_the_official_message(
    host: Any, project: Path
) -> None:
    req = language_pb2.RunRequest(
        project="p",
        stack="s",
        pwd=str(project),
        monitor_address="127.0.0.1:1",
        info=_info(project, {"virtualenv": "nope"}),
    )
    err = _rpc_error(host.Run, req)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details().startswith(
        f"The 'virtualenv' option in Pulumi.yaml is set to \"nope\", but \"{project / 'nope'}\" "
        "doesn't exist; run the following commands"
    ), err.details()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"virtualenv": 1}, "virtualenv option must be a string"),
        ({"toolchain": "conda"}, "unsupported toolchain option: conda"),
        ({"toolchain": True}, "toolchain option must be a string"),
        ({"typechecker": "pylint"}, "unsupported typechecker option: pylint"),
    ],
)
def test_bad_runtime_options_fail_with_the_official_messages(
    host: Any, project: Path, options: dict[str, Any], message: str
) -> None:
    err = _rpc_error(
        host.GetRequiredPackages,
        language_pb2.GetRequiredPackagesRequest(info=_info(project, options)),
    )
    assert err.details() == message


def test_the_virtualenv_option_is_relative_to_the_project_root(tmp_path: Path) -> None:
    # Pulumi.yaml's `main:` may point elsewhere; the venv is still the root's.
    root, program = tmp_path / "root", tmp_path / "program"
    for d in (root, program):
        (d / ".venv" / "bin").mkdir(parents=True)
        (d / ".venv" / "bin" / "python").touch()
    opts = langhost.parse_options(str(root), str(program), {"virtualenv": ".venv"})
    cmd, _ = langhost.python_command(opts, {"PATH": "/bin"})
    assert cmd == str(root / ".venv" / "bin" / "python")
    elsewhere = {"virtualenv": str(program / ".venv")}
    absolute = langhost.parse_options(str(root), str(program), elsewhere)
    assert langhost.python_command(absolute, {})[0] == str(program / ".venv" / "bin" / "python")


def test_the_program_runs_with_the_virtualenv_activated(tmp_path: Path) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    opts = langhost.parse_options(str(tmp_path), str(tmp_path), {"virtualenv": "venv"})
    env = {"PATH": "/usr/bin", "PYTHONHOME": "/x", "VIRTUAL_ENV": "/other", "HOME": "/h"}
    _, got = langhost.python_command(opts, env)
    assert got == {
        "PATH": f"{tmp_path / 'venv' / 'bin'}{os.pathsep}/usr/bin",
        "VIRTUAL_ENV": str(tmp_path / "venv"),
        "HOME": "/h",
    }


def test_without_a_virtualenv_the_interpreter_is_pulumi_python_cmd_or_python3_on_path(
    tmp_path: Path,
) -> None:
    (tmp_path / "python3").symlink_to(sys.executable)
    opts = langhost.parse_options(str(tmp_path), str(tmp_path), {})
    env = {"PATH": str(tmp_path)}
    assert langhost.python_command(opts, env) == (str(tmp_path / "python3"), env)
    custom = {**env, "PULUMI_PYTHON_CMD": sys.executable}
    assert langhost.python_command(opts, custom)[0] == sys.executable
    with pytest.raises(langhost.HostError, match="failed to locate any of") as caught:
        langhost.python_command(opts, {"PATH": str(tmp_path / "none")})
    # The official pip toolchain's wording since 3.261 (sdk/python/toolchain/pip.go).
    assert str(caught.value) == (
        'failed to locate any of ["python3" "python"] on your PATH. '
        "Have you installed Python 3.10 or greater?"
    )


def test_a_lock_file_of_another_toolchain_is_named_not_ignored(tmp_path: Path) -> None:
    # The official host picks uv or poetry from uv.lock / poetry.lock when no toolchain is set;
    # the stand-in runs pip only, so it says so instead of running the wrong environment.
    (tmp_path / "uv.lock").touch()
    (tmp_path / "prog").mkdir()
    opts = langhost.parse_options(str(tmp_path), str(tmp_path / "prog"), {})
    with pytest.raises(langhost.HostError, match="toolchain uv"):
        langhost.python_command(opts, {"PATH": "/bin"})
    pip = langhost.parse_options(str(tmp_path), str(tmp_path / "prog"), {"toolchain": "pip"})
    (tmp_path / "python3").symlink_to(sys.executable)
    assert langhost.python_command(pip, {"PATH": str(tmp_path)})[0] == str(tmp_path / "python3")


@pytest.mark.parametrize(
    ("package", "plugin"),
    [
        ("4.25.0", "4.25.0"),
        ("1.0", "1.0.0"),
        ("1.2.3a4", "1.2.3-alpha.4"),
        ("1.2.3b4", "1.2.3-beta.4"),
        ("1.2.3rc4", "1.2.3-rc.4"),
        ("1.2.3.post4", "1.2.3+post4"),
        ("1.2.3.dev5", "1.2.3+dev5"),
        ("1.2.3.post4.dev5", "1.2.3+post4dev5"),
    ],
)
def test_plugin_versions_follow_the_official_pep440_translation(package: str, plugin: str) -> None:
    assert langhost.plugin_version(package) == plugin


@pytest.mark.parametrize("package", ["", "1!2.0", "1.2.3x"])
def test_untranslatable_package_versions_are_skipped(package: str) -> None:
    with pytest.raises(ValueError):
        langhost.plugin_version(package)


def test_packages_without_a_resource_plugin_are_left_out() -> None:
    dep = langhost.package_dependency
    assert dep("pulumi-random", "4.1.0", None) == ("random", "v4.1.0", "", None, None)
    assert dep("pulumi-policy", "1.0.0", None) is None  # known to have no plugin
    assert dep("pulumi-x", "1.0.0", {"resource": False}) is None
    assert dep("acme", "0.1.0", {"resource": True, "name": "acme-x", "version": "v2.0.0",
                                 "server": "https://s"}) == (
        "acme-x", "v2.0.0", "https://s", None, None)  # fmt: skip
    param = {"name": "p", "version": "1.0.0", "value": "eA=="}
    assert dep("acme", "0.1.0", {"resource": True, "parameterization": param})[3] == param  # type: ignore[index]


def test_installed_packages_are_those_pip_list_shows(project: Path) -> None:
    # One interpreter start instead of the official host's two (pip list, then the
    # pulumi-plugin.json lookup): the same packages, the same plugin files.
    python = str(project / ".venv" / "bin" / "python")
    listed = json.loads(
        subprocess.run(
            [python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    found = langhost.installed_packages(python, {"PATH": os.environ.get("PATH", "")})
    assert sorted((langhost.normalize_name(p["name"]), p["version"]) for p in listed) == sorted(
        (name, version) for name, version, _ in found
    )
    plugin_files = {name: path for name, _, path in found if path}
    assert list(plugin_files) == ["pulumi-kubernetes"]
    assert json.loads(Path(plugin_files["pulumi-kubernetes"]).read_text())["name"] == "kubernetes"


def test_plugin_info_is_the_sdk_version(host: Any) -> None:
    info = host.GetPluginInfo(empty_pb2.Empty(), timeout=30)
    assert info.version.lstrip("v") == langhost._sdk_version()


def test_a_named_virtualenv_that_is_missing_is_created_as_the_pip_toolchain_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "requirements.txt").write_text("pulumi\n")
    (tmp_path / "python3").symlink_to(sys.executable)
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        assert kw["env"]["VIRTUAL_ENV"] == str(tmp_path / "venv")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(langhost.subprocess, "run", run)
    opts = langhost.parse_options(str(tmp_path), str(tmp_path), {"virtualenv": "venv"})
    langhost.ensure_virtualenv(opts, str(tmp_path), {"PATH": str(tmp_path)})
    python = str(tmp_path / "venv" / "bin" / "python")
    assert calls == [
        [str(tmp_path / "python3"), "-m", "venv", str(tmp_path / "venv")],
        [python, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"],
        [python, "-m", "pip", "install", "-r", "requirements.txt"],
    ]
    # An existing virtualenv, or no option, is left alone.
    calls.clear()
    langhost.ensure_virtualenv(
        langhost.parse_options(str(tmp_path), str(tmp_path), {}), str(tmp_path), {}
    )
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    langhost.ensure_virtualenv(opts, str(tmp_path), {"PATH": str(tmp_path)})
    assert calls == []


# The LanguageRuntime RPCs of sdk/v3 v3.276.0 (the CLI) and of the Python SDK 3.272.0; a new
# RPC in a later pin fails this list and asks for a look at what the CLI expects of it.
SERVED_RPCS = {
    "GetPluginInfo",
    "GetRequiredPlugins",
    "GetRequiredPackages",
    "About",
    "Cancel",
    "Run",
    "RunPlugin",  # a component provider written in Python (provider/)
    "InstallDependencies",  # `pulumi install`, `pulumi package add` of a Python plugin
}
UNSERVED_RPCS = {
    "Handshake",  # optional: the CLI goes on without it
    "RuntimeOptionsPrompts",
    "Template",
    "GetProgramDependencies",
    "GenerateProgram",
    "GenerateProject",
    "GeneratePackage",
    "Pack",
    "Link",
}


def test_the_host_knows_every_rpc_of_the_pinned_protocol() -> None:
    service = language_pb2.DESCRIPTOR.services_by_name["LanguageRuntime"]
    assert {m.name for m in service.methods} == SERVED_RPCS | UNSERVED_RPCS


@pytest.mark.parametrize("name", sorted(UNSERVED_RPCS))
def test_rpcs_the_host_does_not_serve_are_unimplemented(host: Any, name: str) -> None:
    service = language_pb2.DESCRIPTOR.services_by_name["LanguageRuntime"]
    method = service.methods_by_name[name]
    request = getattr(language_pb2, method.input_type.name, None)
    request = request() if request is not None else empty_pb2.Empty()
    if name in ("GenerateProgram", "GenerateProject"):
        request.mapper_target = "127.0.0.1:1"  # new field, 3.261-3.276
    call = getattr(host, name)
    with pytest.raises(grpc.RpcError) as caught:
        result = call(request, timeout=60)
        if method.server_streaming:
            list(result)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


PLUGIN_MAIN = """
import os, sys
print("4242", flush=True)
print("argv=" + repr(sys.argv[1:]), flush=True)
print("cwd=" + os.getcwd(), flush=True)
print("venv=" + os.environ.get("VIRTUAL_ENV", ""), flush=True)
print("extra=" + os.environ.get("PMEM_CSI_EXTRA", ""), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("PMEM_CSI_WAIT_FILE"):
    open(os.environ["PMEM_CSI_WAIT_FILE"], "w").write(str(os.getpid()))
    import time
    while True:
        time.sleep(1)
sys.exit(int(os.environ.get("PMEM_CSI_EXIT", "0")))
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A Python plugin as ``pulumi package add`` finds one: ``__main__.py`` and ``venv``."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "__main__.py").write_text(PLUGIN_MAIN)
    (plugin / "venv").symlink_to(toolchain.PROJECT_DIR / ".venv")
    return plugin


def _run_plugin(host: Any, plugin: Path, options: dict[str, Any], *env: str, kind: str = "resource",
                pwd: Path | None = None) -> tuple[bytes, bytes, list[int]]:  # fmt: skip
    req = language_pb2.RunPluginRequest(
        pwd=str(pwd or plugin.parent),
        args=["127.0.0.1:1234", "--logtostderr"],
        env=list(env),
        info=_info(plugin, options),
        kind=kind,
        name="pmem-csi",
    )
    out, err, codes = b"", b"", []
    for msg in host.RunPlugin(req, timeout=120):
        which = msg.WhichOneof("output")
        if which == "stdout":
            out += msg.stdout
        elif which == "stderr":
            err += msg.stderr
        else:
            codes.append(msg.exitcode)
    return out, err, codes


def test_run_plugin_starts_its_main_in_its_default_virtualenv_and_streams_the_output(
    host: Any, plugin_dir: Path, tmp_path: Path
) -> None:
    # No virtualenv option: a plugin's is ``venv`` next to it (the official parseOptions).
    out, err, codes = _run_plugin(host, plugin_dir, {}, "PMEM_CSI_EXTRA=from-the-cli",
                                  pwd=tmp_path)  # fmt: skip
    lines = out.decode().splitlines()
    assert lines[0] == "4242"  # the port line, first, as the CLI reads it
    assert lines[1:] == [
        "argv=['127.0.0.1:1234', '--logtostderr']",
        f"cwd={tmp_path}",
        f"venv={plugin_dir / 'venv'}",
        "extra=from-the-cli",
    ]
    assert err.decode() == "to stderr\n"
    assert codes == []  # exit 0: the stream just ends


def test_run_plugin_ends_with_the_plugins_exit_code(host: Any, plugin_dir: Path) -> None:
    _, _, codes = _run_plugin(host, plugin_dir, {"virtualenv": "venv"}, "PMEM_CSI_EXIT=3")
    assert codes == [3]


def test_a_plugin_exit_by_signal_is_reported_as_go_reports_it() -> None:
    assert langhost.plugin_exit_code(0) is None
    assert langhost.plugin_exit_code(2) == 2
    assert langhost.plugin_exit_code(-9) == -1


def test_a_plugin_without_its_virtualenv_fails_with_the_official_message(
    host: Any, plugin_dir: Path
) -> None:
    (plugin_dir / "venv").unlink()
    req = language_pb2.RunPluginRequest(pwd=str(plugin_dir), info=_info(plugin_dir, {}))
    err = _rpc_error(lambda r, timeout: list(host.RunPlugin(r, timeout=timeout)), req)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details().startswith(
        f"The 'virtualenv' option in Pulumi.yaml is set to \"venv\", but "
        f"\"{plugin_dir / 'venv'}\" doesn't exist"
    ), err.details()


@pytest.mark.parametrize(
    ("kind", "remove_main", "message"),
    [
        ("analyzer", False, "policy packs are not supported by the stand-in"),
        ("resource", True, "has no __main__.py"),
    ],
)
def test_plugins_the_stand_in_cannot_run_are_refused_by_name(
    host: Any, plugin_dir: Path, kind: str, remove_main: bool, message: str
) -> None:
    if remove_main:
        (plugin_dir / "__main__.py").unlink()
    req = language_pb2.RunPluginRequest(pwd=str(plugin_dir), info=_info(plugin_dir, {}), kind=kind)
    err = _rpc_error(lambda r, timeout: list(host.RunPlugin(r, timeout=timeout)), req)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert message in err.details()


def test_cancelling_run_plugin_kills_the_plugin(
    host: Any, plugin_dir: Path, tmp_path: Path
) -> None:
    from tests.e2e.waiting import wait_for

    pid_file = tmp_path / "pid"
    req = language_pb2.RunPluginRequest(
        pwd=str(plugin_dir), info=_info(plugin_dir, {}),
        env=[f"PMEM_CSI_WAIT_FILE={pid_file}"],
    )  # fmt: skip
    stream = host.RunPlugin(req, timeout=120)
    # Output arrives as the plugin writes it: the port line, whichever stream comes first.
    assert any(msg.stdout.startswith(b"4242") for msg in stream)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "plugin pid"))
    stream.cancel()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A killed child the host has not reaped yet is gone too.
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        except (FileNotFoundError, ProcessLookupError):  # reaped meanwhile
            return True

    wait_for(gone, 60, "the cancelled plugin to end")


def test_a_plugins_virtualenv_defaults_to_venv_only_with_the_pip_toolchain() -> None:
    assert langhost.parse_options("/p", "/p", {}, is_plugin=True).virtualenv == "venv"
    assert langhost.parse_options("/p", "/p", {"toolchain": "pip"}, is_plugin=True).virtualenv == (
        "venv"
    )
    named = langhost.parse_options("/p", "/p", {"virtualenv": "../.venv"}, is_plugin=True)
    assert named.virtualenv == "../.venv"
    assert langhost.parse_options("/p", "/p", {"toolchain": "uv"}, is_plugin=True).virtualenv == ""
    assert langhost.parse_options("/p", "/p", {}).virtualenv == ""  # a program: none


def test_install_dependencies_streams_the_pip_toolchain_steps(
    host: Any, plugin_dir: Path
) -> None:
    req = language_pb2.InstallDependenciesRequest(info=_info(plugin_dir, {}), is_plugin=True)
    out = b"".join(m.stdout for m in host.InstallDependencies(req, timeout=120))
    # The virtualenv exists and there is no requirements.txt: nothing to run.
    assert out == b"Installing dependencies...\n\nFinished installing dependencies\n\n"


def test_install_dependencies_creates_a_missing_virtualenv_then_installs_requirements(
    tmp_path: Path,
) -> None:
    (tmp_path / "requirements.txt").write_text("pulumi\n")
    (tmp_path / "python3").symlink_to(sys.executable)
    env = {"PATH": str(tmp_path)}
    opts = langhost.parse_options(str(tmp_path), str(tmp_path), {}, is_plugin=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    assert [cmd for _, cmd in langhost.install_dependencies_steps(opts, env)] == [
        [str(tmp_path / "python3"), "-m", "venv", str(tmp_path / "venv")],
        [python, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"],
        [python, "-m", "pip", "install", "-r", "requirements.txt"],
    ]
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    assert [cmd for _, cmd in langhost.install_dependencies_steps(opts, env)] == [
        [python, "-m", "pip", "install", "-r", "requirements.txt"],
    ]


class _Context:
    """The parts of a gRPC servicer context RunPlugin uses (the call in this process)."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_callback(self, callback: Any) -> bool:
        self.callbacks.append(callback)
        return True

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def test_plugins_are_neither_interrupted_by_cancel_nor_kept_after_they_end(
    plugin_dir: Path, tmp_path: Path
) -> None:
    """The official host has no Cancel for plugins (the CLI stops one by cancelling its
    RunPlugin call); an ended plugin's process is not kept for the host's lifetime."""
    from tests.e2e.waiting import wait_for

    servicer = langhost.make_servicer(langhost.HostArgs(), Path(langhost.__file__))
    pid_file = tmp_path / "pid"
    req = language_pb2.RunPluginRequest(
        pwd=str(plugin_dir), info=_info(plugin_dir, {}), env=[f"PMEM_CSI_WAIT_FILE={pid_file}"]
    )
    context = _Context()
    stream = servicer.RunPlugin(req, context)
    assert any(msg.stdout.startswith(b"4242") for msg in stream)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "plugin pid")
    assert servicer._running == set()  # what Cancel and the host's signal handler interrupt
    for callback in context.callbacks:  # the CLI cancels the call: the plugin is killed
        callback()
    assert [m.exitcode for m in stream if m.WhichOneof("output") == "exitcode"] == [-1]
    assert servicer._running == set()

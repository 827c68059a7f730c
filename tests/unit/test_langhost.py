"""The stand-in language host: argv, interpreter choice, what Run passes on, quiet shutdown.

The whole path (CLI -> host -> program -> engine) is shown end to end in
tests/e2e/test_cli.py; these tests pin the pieces the CLI cannot show one by one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools import langhost, toolchain
from tools.langhost_exec import MissingProgramError, program_file


def test_argv_as_the_cli_passes_it() -> None:
    # The CLI passes only the engine address; tracing comes as a Go flag when enabled.
    assert langhost.parse_argv(["127.0.0.1:4567"]) == langhost.HostArgs("127.0.0.1:4567")
    args = langhost.parse_argv(["-tracing", "http://zipkin", "--use-executor=/x", "e:1"])
    assert args == langhost.HostArgs("e:1", tracing="http://zipkin", executor="/x")
    assert langhost.parse_argv(["-version"]).show_version
    assert langhost.parse_argv([]).engine_address == ""


def _run_request(**fields: object) -> SimpleNamespace:
    base: dict[str, object] = {
        "monitor_address": "127.0.0.1:1",
        "project": "pmem-csi-pulumi",
        "stack": "prod",
        "pwd": "/src",
        "dryRun": True,
        "parallel": 16,
        "organization": "organization",
        "program": "",
        "args": [],
        "config": {"pmem-csi:manageCrd": "true", "pmem-csi:deployments": "[]"},
        "configSecretKeys": ["pmem-csi:deployments"],
        "info": SimpleNamespace(root_directory="/src", program_directory="/src", entry_point="."),
    }
    base.update(fields)
    return SimpleNamespace(**base)


def test_run_passes_on_everything_the_cli_sent() -> None:
    req = _run_request()
    args = langhost.executor_arguments(req, "127.0.0.1:2", "")
    assert args == [
        "--monitor", "127.0.0.1:1",
        "--engine", "127.0.0.1:2",
        "--project", "pmem-csi-pulumi",
        "--root_directory", "/src",
        "--stack", "prod",
        "--pwd", "/src",
        "--dry_run", "true",
        "--parallel", "16",
        "--organization", "organization",
        ".",
    ]  # fmt: skip
    update = langhost.executor_arguments(_run_request(dryRun=False), "e", "")
    assert update[update.index("--dry_run") + 1] == "false"
    env = langhost.executor_environment(req, {"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert json.loads(env["PULUMI_CONFIG"]) == req.config
    assert json.loads(env["PULUMI_CONFIG_SECRET_KEYS"]) == ["pmem-csi:deployments"]


def test_exit_status_32_bails_so_the_error_is_shown_once() -> None:
    assert langhost.exit_status_response(0) == ("", False)
    assert langhost.exit_status_response(32) == ("", True)
    assert langhost.exit_status_response(1) == ("program exited with non-zero exit code: 1", False)
    assert "signal 9" in langhost.exit_status_response(-9)[0]


def test_executor_finds_main_in_the_program_directory(tmp_path: Path) -> None:
    with pytest.raises(MissingProgramError, match=r"__main__\.py"):
        program_file(str(tmp_path))
    (tmp_path / "__main__.py").write_text("")
    assert program_file(str(tmp_path)) == str(tmp_path / "__main__.py")


def test_install_next_to_the_cli_is_idempotent_and_outside_the_cache_key(tmp_path: Path) -> None:
    toolchain.install_language_host(tmp_path)
    host = tmp_path / "pulumi-language-python"
    assert host.read_bytes() == (toolchain.TOOLS_DIR / "langhost.sh").read_bytes()
    for name in ("pulumi-language-python", "pulumi-language-python-host",
                 "pulumi-language-python-exec"):
        assert os.access(tmp_path / name, os.X_OK), name
    mtime = host.stat().st_mtime_ns
    toolchain.install_language_host(tmp_path)
    assert host.stat().st_mtime_ns == mtime
    host.write_text("stale")
    toolchain.install_language_host(tmp_path)
    assert host.read_bytes() == (toolchain.TOOLS_DIR / "langhost.sh").read_bytes()
    # Installing the host never changes the pulumi group's cache key (no CLI rebuild).
    pulumi = toolchain.GROUPS["pulumi"]
    assert pulumi.install is not None
    bare = toolchain.Group(pulumi.name, pulumi.packages, pulumi.ldflags, pulumi.tags)
    assert bare.key() == pulumi.key()


def _venv_first() -> dict[str, str]:
    """PATH as the offline environment has it: the project's python3 first.

    Without the checkout's host directory (which an end-to-end fixture of the same worker may
    have put into the environment): these tests run the copy installed next to the launcher.
    """
    venv_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != toolchain.LANGUAGE_HOST_DIR_ENV}
    return {**env, "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")])}


def _start_host(bin_dir: Path) -> subprocess.Popen[str]:
    """The launcher installed in ``bin_dir`` and started as the CLI starts it (engine address
    last), its own copy of the host (see :func:`_venv_first`)."""
    toolchain.install_language_host(bin_dir)
    return subprocess.Popen(
        [str(bin_dir / "pulumi-language-python"), "127.0.0.1:1"],
        env=_venv_first(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """SIGINT handled in this process while the test runs, so the host started here begins
    with it at its default, as under a CLI run in a terminal.

    A test session started in the background by a non-interactive shell (``make test &``,
    ``nohup``) inherits SIGINT ignored, and an ignored signal stays ignored across ``exec``:
    the host would then not see a SIGINT sent before it has installed its own handlers, and
    keep serving. A handler does not survive ``exec``, so a child of this process starts with
    the default.
    """
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_host_serves_prints_its_port_and_stops_quietly(tmp_path: Path, signum: int) -> None:
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import language_pb2_grpc

    proc = _start_host(tmp_path)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = language_pb2_grpc.LanguageRuntimeStub(channel).GetPluginInfo(
                empty_pb2.Empty(), timeout=10
            )
        assert info.version == langhost._sdk_version()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert err == ""


def test_host_loads_only_the_protocol_modules_not_the_sdk() -> None:
    # In a fresh interpreter, as the CLI starts the host: the SDK's runtime (pulumi/__init__,
    # pulumi.runtime.stack, ...) is not imported, only the generated LanguageRuntime modules.
    code = (
        "import sys; from tools import langhost; mods = langhost._import_protos(); "
        "print(mods[1].LanguageRuntimeServicer.__name__, 'pulumi.runtime.stack' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=toolchain.PROJECT_DIR,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["LanguageRuntimeServicer", "False"]


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_host_stopped_at_any_moment_of_its_start_is_quiet(tmp_path: Path, delay: float) -> None:
    # The CLI stops plugins whenever it is done, possibly while one is still starting.
    import time

    proc = _start_host(tmp_path)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    # Quiet is what counts: before Python has installed handlers, the interpreter ends with
    # its own status (killed by the signal, or 1), after that ours (0); never with a traceback.
    assert proc.returncode in (0, 1, -signal.SIGINT), (proc.returncode, err)
    assert err == ""


def test_host_errors_reach_stderr_after_the_quiet_start(tmp_path: Path) -> None:
    # The launcher parks stderr during Python's start-up; real errors must still be seen.
    toolchain.install_language_host(tmp_path)
    (tmp_path / "pulumi-language-python-exec").unlink()
    result = subprocess.run(
        [str(tmp_path / "pulumi-language-python"), "127.0.0.1:1"],
        env=_venv_first(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "missing executor" in result.stderr


def test_the_shared_launcher_runs_the_checkouts_own_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools cache (with the launcher next to the CLI) is shared by checkouts whose
    langhost.py differ: the one found by the CLI runs the host installed for this checkout
    (its state directory, named by pulumi_env), not whichever checkout installed last."""
    from tools import localenv

    shared, own = tmp_path / "shared", tmp_path / "state"
    shared.mkdir()
    toolchain.install_language_host(shared)
    (shared / "pulumi-language-python-host").write_text("print('the other checkout')\n")
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(own))
    env = localenv.pulumi_env()
    toolchain.install_language_host(Path(env[toolchain.LANGUAGE_HOST_DIR_ENV]))
    assert Path(env[toolchain.LANGUAGE_HOST_DIR_ENV]).is_relative_to(own)
    host = Path(env[toolchain.LANGUAGE_HOST_DIR_ENV]) / "pulumi-language-python-host"
    host.write_text("import sys; print('this checkout', sys.argv[1:])\n")
    got = subprocess.run(
        [str(shared / "pulumi-language-python"), "127.0.0.1:1"],
        env={**_venv_first(), toolchain.LANGUAGE_HOST_DIR_ENV: str(host.parent)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert got.stdout == "this checkout ['127.0.0.1:1']\n"


KEY_FILE_PROGRAM = """\
import base64, os, signal, sys, time

from kubernetes import client, config

from tools import langhost_exec

signal.signal(signal.SIGINT, langhost_exec._exit_quietly)
key = base64.b64encode(b"-----BEGIN PRIVATE KEY-----\\nnot a real one\\n").decode()
config.load_kube_config_from_dict({
    "apiVersion": "v1", "kind": "Config", "current-context": "c",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"client-certificate-data": key, "client-key-data": key}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
})
conf = client.Configuration.get_default_copy()
print(conf.key_file, flush=True)
while True:
    time.sleep(1)
"""


def test_a_program_stopped_by_sigint_leaves_no_kubeconfig_key_file_behind(tmp_path: Path) -> None:
    """Review: the executor's quiet exit on Ctrl-C (``_exit_quietly``) skipped the ``atexit``
    handlers that its normal exit runs, and the Kubernetes client removes in one the temporary
    file it wrote the kubeconfig's client key to: the key stayed in $TMPDIR after a Ctrl-C."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", KEY_FILE_PROGRAM], cwd=toolchain.PROJECT_DIR,
                            env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        key_file = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
        assert key_file.is_file() and key_file.is_relative_to(tmp_path), key_file
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not key_file.exists()

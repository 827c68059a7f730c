"""The README's "Using it on a real cluster", run line by line with the real Pulumi CLI.

Every ``sh`` block of that README section is parsed from README.md and each line is run with
``bash -c`` exactly as written, in a copy of the checkout (``Pulumi.yaml``, ``__main__.py``,
``pmem_components/``, ``crd/``, ``requirements.txt`` and a ``.venv`` link to this checkout's),
against the local cluster. The differences from a real cluster are the ones the README states:
the offline environment of ``tools/localenv.py`` (here with a backend of this module's own)
and certificates generated into the five files the commands read.

The CLI runs ``__main__.py`` through the stand-in language host next to it, so what these
tests show is the administrator's path: ``Pulumi.<stack>.yaml`` written by ``pulumi config
set``, secrets encrypted by the CLI, the program started by the CLI.

The deployment uses the README's defaults (``pmem-csi.intel.com`` in ``pmem-csi``, CRD managed
by the stack). ``pulumi destroy`` therefore deletes the shared CRD; if it existed before, the
module re-creates it afterwards for the test modules that follow.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pmem_components import names
from tests.e2e.readme import Shell, project_copy, sh_blocks
from tests.e2e.waiting import wait_for
from tests.unit import certutil
from tools import localenv, toolchain

pytestmark = pytest.mark.timeout(900)

SECTION = "## Using it on a real cluster"
NAMESPACE = "pmem-csi"
H = "pmem-csi-intel-com"
# Pulumi's marker of an encrypted value in an exported state.
SECRET_SIG = "4dabf18193072939515e22adb298388d"


@pytest.fixture(scope="module")
def certs() -> certutil.CertSet:
    return certutil.good_set()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory, certs: certutil.CertSet) -> Path:
    """A copy of the project as an administrator's clone has it, plus the five PEM files."""
    root = project_copy(tmp_path_factory.mktemp("checkout"))
    files = {
        "ca.crt": certs.ca_cert,
        "registry.crt": certs.registry_cert,
        "registry.key": certs.registry_key,
        "node-controller.crt": certs.node_controller_cert,
        "node-controller.key": certs.node_controller_key,
    }
    for name, pem in files.items():
        (root / name).write_text(pem)
    return root


@pytest.fixture(scope="module")
def shell(
    pulumi_ready: dict[str, str], local_cluster: Path, checkout: Path, tmp_path_factory: Any
) -> Shell:
    backend = tmp_path_factory.mktemp("backend")
    env = {**os.environ, **localenv.pulumi_env()}
    env["PULUMI_BACKEND_URL"] = backend.as_uri()
    env["KUBECONFIG"] = str(local_cluster)
    # The administrator's kubectl: the locally built one, matching the server.
    env["PATH"] = os.pathsep.join([str(toolchain.bin_path("kubectl").parent), env["PATH"]])
    return Shell(checkout, env)


def kubectl_json(shell: Shell, *args: str) -> dict[str, Any] | None:
    result = subprocess.run(
        [str(toolchain.bin_path("kubectl")), *args, "-o", "json"],
        env=shell.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def shared_crd(shell: Shell) -> Iterator[None]:
    """Put the CRD back after this module if another module had installed it."""
    existed = kubectl_json(shell, "get", "crd", names.CRD_NAME) is not None
    yield
    if existed and kubectl_json(shell, "get", "crd", names.CRD_NAME) is None:
        crd = toolchain.PROJECT_DIR / "crd"
        subprocess.run(
            [str(toolchain.bin_path("kubectl")), "apply", "--server-side", "-f", str(crd)],
            env=shell.env,
            check=True,
            capture_output=True,
            timeout=60,
        )


def _secret_key(shell: Shell, name: str) -> str:
    secret = kubectl_json(shell, "get", "secret", "-n", NAMESPACE, name)
    assert secret is not None, name
    return base64.b64decode(secret["data"]["tls.key"]).decode()


def _no_plaintext_keys(text: str, certs: certutil.CertSet) -> None:
    for key in (certs.registry_key, certs.node_controller_key):
        body = "".join(key.strip().splitlines()[1:-1])
        assert body[:64] not in text.replace("\\n", "").replace("\n", "")
        assert base64.b64encode(key.encode()).decode()[:64] not in text
    assert "PRIVATE KEY" not in text


def test_readme_blocks_deploy_check_and_remove(
    shell: Shell, certs: certutil.CertSet, shared_crd: None
) -> None:
    deploy, repair, remove = sh_blocks(SECTION)

    # ---- deploy, line by line; the cluster is looked at between the lines that matter.
    assert deploy.count("pulumi preview") == 1, deploy  # the check below must run
    for line in deploy:
        shell.run(line)
        if line == "pulumi preview":
            out = shell.output(line)
            assert re.search(r"\d+ to create", out), out
            assert kubectl_json(shell, "get", "namespace", NAMESPACE) is None, "preview created"
    settings = yaml.safe_load((shell.cwd / "Pulumi.prod.yaml").read_text())
    config = settings["config"]
    assert config["pmem-csi:manageCrd"] in (True, "true")
    dep = config["pmem-csi:deployments"][0]
    assert dep["name"] == "pmem-csi.intel.com" and dep["deviceMode"] == "direct"
    assert dep["certificates"]["caCert"].strip() == certs.ca_cert.strip()
    # --secret: the stack file holds the private keys only encrypted.
    assert set(dep["certificates"]["registryKey"]) == {"secure"}
    assert set(dep["certificates"]["nodeControllerKey"]) == {"secure"}
    _no_plaintext_keys((shell.cwd / "Pulumi.prod.yaml").read_text(), certs)

    first_up = shell.output("pulumi up --yes")
    assert re.search(r"\d+ created", first_up), first_up
    sts = kubectl_json(shell, "get", "statefulset", "-n", NAMESPACE, f"{H}-controller")
    ds = kubectl_json(shell, "get", "daemonset", "-n", NAMESPACE, f"{H}-node")
    assert sts is not None and ds is not None
    # The provided keys (read from the files by `pulumi config set`) reached the Secrets.
    assert _secret_key(shell, f"{H}-registry-secrets").strip() == certs.registry_key.strip()
    assert _secret_key(shell, f"{H}-node-secrets").strip() == certs.node_controller_key.strip()
    for svc in (f"{H}-controller", f"{H}-metrics"):
        obj = kubectl_json(shell, "get", "service", "-n", NAMESPACE, svc)
        assert obj and obj["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    cr = kubectl_json(shell, "get", "deployments.pmem-csi.intel.com", "pmem-csi.intel.com")
    assert cr is not None and cr["spec"]["deviceMode"] == "direct"
    assert "PRIVATE KEY" not in json.dumps(cr)
    reporter = kubectl_json(shell, "get", "deployment", "-n", NAMESPACE, f"{H}-reporter")
    assert reporter is not None
    image = reporter["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/pmem-csi-reporter:v1"

    second_up = shell.output("pulumi up --yes --expect-no-changes")
    assert not re.search(r"\d+ (created|updated|deleted|replaced)", second_up), second_up
    assert re.search(r"\d+ unchanged", second_up), second_up

    outputs = json.loads(shell.output("pulumi stack output deployments"))
    assert outputs["pmem-csi.intel.com"]["namespace"] == NAMESPACE
    assert outputs["pmem-csi.intel.com"]["caCert"].strip() == certs.ca_cert.strip()
    _no_plaintext_keys(json.dumps(outputs), certs)

    # ---- someone deletes the node DaemonSet; refresh notices, up restores it.
    subprocess.run(
        [str(toolchain.bin_path("kubectl")), "delete", "daemonset", "-n", NAMESPACE, f"{H}-node"],
        env=shell.env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    uid_before = ds["metadata"]["uid"]
    for line in repair:
        shell.run(line)
    refresh = shell.output("pulumi refresh --yes")
    assert re.search(r"\d+ deleted", refresh), refresh
    restored = kubectl_json(shell, "get", "daemonset", "-n", NAMESPACE, f"{H}-node")
    assert restored is not None and restored["metadata"]["uid"] != uid_before
    exported = (shell.cwd / "prod-state.json").read_text()
    state = json.loads(exported)
    assert any(
        r["type"] == "kubernetes:apps/v1:DaemonSet" for r in state["deployment"]["resources"]
    )
    assert SECRET_SIG in exported
    _no_plaintext_keys(exported, certs)

    # ---- remove everything, the stack included. `destroy` keeps the namespace and the CRD
    # (stack-level objects other deployments and stacks may use); the administrator deletes
    # the namespace, as the README says.
    assert remove[0] == "pulumi destroy --yes", remove
    shell.run(remove[0])
    assert kubectl_json(shell, "get", "csidriver", "pmem-csi.intel.com") is None
    assert kubectl_json(shell, "get", "daemonset", "-n", NAMESPACE, f"{H}-node") is None
    assert kubectl_json(shell, "get", "namespace", NAMESPACE) is not None, "namespace not kept"
    assert kubectl_json(shell, "get", "crd", names.CRD_NAME) is not None, "CRD not kept"
    for line in remove[1:]:
        shell.run(line)
    wait_for(
        lambda: kubectl_json(shell, "get", "namespace", NAMESPACE) is None,
        120,
        "namespace pmem-csi deleted",
    )
    stacks = shell.run("pulumi stack ls --json").stdout
    assert [s["name"] for s in json.loads(stacks)] == []
    # No command printed a private key (the CLI's progress, diffs and outputs included).
    for _, result in shell.log:
        _no_plaintext_keys(result.stdout + result.stderr, certs)


def test_bad_config_fails_preview_with_one_message_naming_each_key(shell: Shell) -> None:
    shell.run("pulumi stack init bad")
    try:
        shell.run("pulumi config set --path 'pmem-csi:deployments[0].deviceMode' foo")
        shell.run("pulumi config set --path 'pmem-csi:deployments[0].pmemPercentage' 0")
        shell.run("pulumi config set --path 'pmem-csi:deployments[0].await.timeout' soon")
        shell.run("pulumi config set pmem-csi:manageCrds false")
        result = shell.run("pulumi preview", check=False)
        out = result.stdout + result.stderr
        assert result.returncode != 0, out
        for key in (
            "pmem-csi:deployments[0].deviceMode: must be one of lvm, direct",
            "pmem-csi:deployments[0].pmemPercentage: must be at least 1",
            "pmem-csi:deployments[0].await.timeout: must be a positive duration",
            "pmem-csi:manageCrds: is not a known setting",
        ):
            assert out.count(key) == 1, (key, out)
        # One error diagnostic (the progress line above it echoes only its first line), and
        # no second copy from the language host ("program exited with ...").
        diagnostics = out[out.index("Diagnostics:") :]
        assert diagnostics.count("error:") == 1, out
        assert "invalid stack configuration (4 problem(s))" in diagnostics, out
        assert "program exited" not in out, out
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    finally:
        shell.run("pulumi stack rm --yes bad")


# Interrupted (Ctrl-C, SIGKILL) and concurrent runs: tests/e2e/test_cli_interruptions.py.


# ---------------------------------------------------------------- the language host itself

PROBE_PROGRAM = """\
import sys

import pulumi
from pulumi.runtime import settings

config = pulumi.Config()
pulumi.export("plain", config.get("plain"))
pulumi.export("secret", config.require_secret("secret"))
pulumi.export("dryRun", pulumi.runtime.is_dry_run())
pulumi.export("organization", pulumi.get_organization())
pulumi.export("project", pulumi.get_project())
pulumi.export("stack", pulumi.get_stack())
pulumi.export("parallel", settings.SETTINGS.parallel)
pulumi.export("interpreter", sys.executable)
print("printed by the program")
"""


def test_language_host_passes_on_what_the_cli_sends(
    pulumi_ready: dict[str, str], tmp_path: Path
) -> None:
    """A program that reports what it was given: config, secret, dry run, names, parallelism."""
    project = tmp_path / "probe"
    project.mkdir()
    # The project's runtime options: the program runs on the virtualenv Pulumi.yaml names.
    runtime = yaml.safe_load((toolchain.PROJECT_DIR / "Pulumi.yaml").read_text())["runtime"]
    (project / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "probe", "runtime": runtime}))
    (project / "__main__.py").write_text(PROBE_PROGRAM)
    (project / ".venv").symlink_to(toolchain.PROJECT_DIR / ".venv")
    backend = tmp_path / "backend"
    backend.mkdir()
    env = {**os.environ, **localenv.pulumi_env(), "PULUMI_BACKEND_URL": backend.as_uri()}
    # The virtualenv not activated (not on PATH): Pulumi.yaml naming it is enough.
    venv_bin = str(toolchain.PROJECT_DIR / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env.pop("VIRTUAL_ENV", None)
    shell = Shell(project, env)
    shell.run("pulumi stack init probe")
    shell.run("pulumi config set plain hello")
    shell.run("printf s3cr3t | pulumi config set --secret secret")
    preview = shell.run("pulumi preview --parallel 3")
    assert "printed by the program" in preview.stdout, preview.stdout
    assert re.search(r"dryRun\s*:\s*true", preview.stdout), preview.stdout
    shell.run("pulumi up --yes --skip-preview --parallel 3")
    out = json.loads(shell.run("pulumi stack output --json --show-secrets").stdout)
    assert out == {
        "plain": "hello",
        "secret": "s3cr3t",
        "dryRun": False,
        "organization": "organization",
        "project": "probe",
        "stack": "probe",
        "parallel": 3,  # the CLI's --parallel
        "interpreter": str(project / ".venv" / "bin" / "python"),
    }
    assert "s3cr3t" not in shell.run("pulumi stack output --json").stdout
    shell.run("pulumi destroy --yes --skip-preview")
    shell.run("pulumi stack rm --yes probe")
    for _, result in shell.log:
        assert "Traceback" not in result.stderr + result.stdout


CTRL_C_PROGRAM = """\
import json, os, signal

import pulumi

# Signals are blocked and waited for, so the program learns who sent SIGINT. Ignored too: the
# host sends SIGINT more than once (its Cancel, then the end of the Run call or its own stop),
# and one that comes while the main thread writes the report would go to another thread and
# run the executor's handler, which exits before the report is written (seen under load).
# A signal the main thread blocks is never dropped as ignored, so the wait still gets it.
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
report = {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0)}
with open(os.environ["PROBE_REPORT"] + ".tmp", "w") as f:
    json.dump(report, f)
os.rename(os.environ["PROBE_REPORT"] + ".tmp", os.environ["PROBE_REPORT"])
info = signal.sigtimedwait([signal.SIGINT, signal.SIGTERM], 300)
with open(os.environ["PROBE_SIGNAL"] + ".tmp", "w") as f:
    json.dump({"signo": info.si_signo, "from": info.si_pid} if info else {}, f)
os.rename(os.environ["PROBE_SIGNAL"] + ".tmp", os.environ["PROBE_SIGNAL"])
os._exit(130)
pulumi.export("unreached", True)
"""


def test_terminal_ctrl_c_reaches_the_cli_which_has_the_host_interrupt_the_program(
    pulumi_ready: dict[str, str], tmp_path: Path
) -> None:
    """``pulumi up`` on a terminal (a pty), Ctrl-C typed while the program runs.

    The terminal sends SIGINT to its foreground process group, the CLI's. Plugins run in
    process groups of their own (the program in its language host's), so the program's SIGINT
    comes from its language host, which the CLI's cancellation asks to stop it.
    """
    import pty
    import threading

    project = tmp_path / "ctrl-c"
    project.mkdir()
    runtime = yaml.safe_load((toolchain.PROJECT_DIR / "Pulumi.yaml").read_text())["runtime"]
    (project / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "ctrlc", "runtime": runtime}))
    (project / "__main__.py").write_text(CTRL_C_PROGRAM)
    (project / ".venv").symlink_to(toolchain.PROJECT_DIR / ".venv")
    backend = tmp_path / "backend"
    backend.mkdir()
    report, got = tmp_path / "program.json", tmp_path / "signal.json"
    env = {**os.environ, **localenv.pulumi_env(), "PULUMI_BACKEND_URL": backend.as_uri(),
           "PROBE_REPORT": str(report), "PROBE_SIGNAL": str(got), "TERM": "xterm"}  # fmt: skip
    shell = Shell(project, env)
    shell.run("pulumi stack init ctrlc")

    pid, fd = pty.fork()
    if pid == 0:  # the CLI, as a shell starts it: session leader and foreground group of the pty
        try:
            os.chdir(project)
            os.execvpe("pulumi", ["pulumi", "up", "--yes", "--skip-preview"], env)
        finally:
            os._exit(127)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the CLI has exited and closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        program = wait_for(lambda: report.exists() and json.loads(report.read_text()), 120,
                           "the program to run")  # fmt: skip
        # Typed only once the program waits for the signal: before, its main thread blocks
        # SIGINT and the kernel hands the signal to another of its threads (the SDK's), whose
        # handler the waiting main thread never sees (seen in CI: no report in 60 s).
        wchan = Path(f"/proc/{program['pid']}/wchan")
        wait_for(lambda: wchan.read_text().startswith("do_sigtimedwait"), 60,
                 "the program to wait for its signal")  # fmt: skip
        os.write(fd, b"\x03")  # Ctrl-C, typed
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    reader.join(timeout=30)
    os.close(fd)
    out = b"".join(chunks).decode(errors="replace")

    cli_group = pid  # the session leader's own group is the terminal's foreground group
    assert program["pgid"] != cli_group, program
    # The CLI may end before the program has written what it got (written whole, by rename).
    signalled = wait_for(lambda: got.exists() and json.loads(got.read_text()), 60,
                         f"the report of the signal; the CLI printed:\n{out}")  # fmt: skip
    assert signalled == {"signo": signal.SIGINT, "from": program["ppid"]}
    assert "^C received; cancelling" in out, out
    assert "update canceled" in out, out
    assert os.waitstatus_to_exitcode(status) == 1, out
    assert "Traceback" not in out, out
    shell.run("pulumi stack rm --yes --force ctrlc")

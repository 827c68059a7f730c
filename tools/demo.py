"""The main job on the local cluster: deploy the `local` stack and show what the reporter says.

Steps: build missing tools, start the local cluster, `pulumi up` the `local` stack
(Pulumi.local.yaml) through the Automation API, run the reporter against the cluster until
it has written the status, then print ``kubectl get deployments.pmem-csi.intel.com`` and the
CR's status. Run it with ``make demo``; ``make cluster-stop`` removes the cluster afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tools import cluster, localenv, toolchain

STACK = "local"
CR_RESOURCE = "deployments.pmem-csi.intel.com"


def _log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def _kubectl(*args: str) -> str:
    kubeconfig = str(localenv.kubeconfig_path())
    return subprocess.run(
        [str(toolchain.bin_path("kubectl")), "--kubeconfig", kubeconfig, *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _project_copy() -> tuple[Path, dict]:
    """Pulumi.yaml copied into the state directory, and the config of Pulumi.local.yaml.

    Selecting a stack with passphrase secrets writes an ``encryptionsalt`` (tied to this state
    directory's random passphrase) into the stack file; that must not end up in the committed
    Pulumi.local.yaml, where it would break every other clone. So the stack runs from a copy,
    whose stack file ``pulumi_stack.select_stack`` rewrites keeping its salt.
    """
    work = localenv.state_dir() / "local-project"
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(toolchain.PROJECT_DIR / "Pulumi.yaml", work / "Pulumi.yaml")
    settings = yaml.safe_load((toolchain.PROJECT_DIR / f"Pulumi.{STACK}.yaml").read_text())
    return work, settings["config"]


def deploy() -> list[str]:
    """`pulumi up` the local stack; return the names of the Deployment CRs it manages."""
    from pmem_components.program import main as program
    from tools import pulumi_stack

    work_dir, config = _project_copy()
    stack = pulumi_stack.select_stack(STACK, program, work_dir, config)
    # --refresh: after `make cluster-stop` the state still lists objects of the old cluster.
    _log(f"pulumi up --refresh --stack {STACK}")
    result = stack.up(refresh=True, on_output=pulumi_stack.printer("  "))
    _log(f"pulumi up: {result.summary.result}, changes {result.summary.resource_changes}")
    outputs = result.outputs
    return [name for name in outputs.get("deployments", {}).value or {}]


def run_reporter(names: list[str], timeout: float = 90) -> None:
    """Run the reporter locally until every CR has a phase, then stop it."""
    cmd = [
        sys.executable,
        "-m",
        "reporter",
        "--kubeconfig",
        str(localenv.kubeconfig_path()),
        "--metrics-port",
        "0",
    ]
    for name in names:
        cmd += ["--deployment", name]
    _log("starting the reporter: " + " ".join(cmd[1:]))
    # The reporter's own output goes to stderr: stdout carries only the demo's result.
    proc = subprocess.Popen(cmd, cwd=toolchain.PROJECT_DIR, stdout=sys.stderr)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = json.loads(_kubectl("get", CR_RESOURCE, "-o", "json"))["items"]
            if items and all(i.get("status", {}).get("phase") for i in items):
                return
            if proc.poll() is not None:
                raise RuntimeError(f"the reporter exited with {proc.returncode}")
            time.sleep(1)
        _log(f"no phase written within {timeout:.0f}s")
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> int:
    t0 = time.monotonic()
    toolchain.build_all()
    cluster.start()
    names = deploy()
    missing = []
    try:
        import reporter.__main__  # noqa: F401
    except ImportError as err:
        missing.append(f"reporter ({err})")
    if not missing:
        run_reporter(names)
    print(_kubectl("get", CR_RESOURCE))
    for name in names:
        cr = json.loads(_kubectl("get", CR_RESOURCE, name, "-o", "json"))
        print(f"status of {name}:")
        print(json.dumps(cr.get("status", {}), indent=2))
    for item in missing:
        _log(f"not run: {item}")
    _log(f"done in {time.monotonic() - t0:.0f}s; 'make cluster-stop' removes the cluster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

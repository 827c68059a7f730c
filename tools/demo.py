"""The main job on the local cluster: deploy the `local` stack and show what the reporter says.

Steps: build missing tools, start the local cluster, run the Pulumi CLI as an administrator
would (``pulumi stack select --create local``, ``pulumi up --yes`` with the CLI's own progress
output; the program is ``__main__.py``, started by the stand-in language host next to the CLI),
then print ``kubectl get deployments.pmem-csi.intel.com`` and the CR's status.

The reporter runs as the program writes it: its Deployment's pods run on the cluster's one real
node (tools/realnode.py; containerd + kubelet, the reporter image from ``make image``), placed
there by a ``patches`` entry added to the stack's config (:func:`realnode.reporter_patch`). The
demo waits until those pods are Running and Ready and the CR has a status, and prints the pods
and the Lease's holder. ``--no-real-node`` runs the reporter as a local process instead, until
it has written the status. Run it with ``make demo``; ``make cluster-stop`` removes the cluster
(and the real node) afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tools import cluster, localenv, realnode, toolchain

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


def _project_dir() -> Path:
    """A project directory in the state directory whose program is this checkout.

    Selecting a stack with passphrase secrets writes an ``encryptionsalt`` (tied to this state
    directory's random passphrase) into the stack file; that must not end up in the committed
    Pulumi.local.yaml, where it would break every other clone. So the CLI runs in a directory
    of its own whose Pulumi.yaml is the project's plus ``main:`` pointing at this checkout
    (the same ``__main__.py``) and the checkout's ``.venv`` named by absolute path; its
    Pulumi.local.yaml holds the committed config plus this state directory's salt.
    """
    work = localenv.state_dir() / "local-project"
    work.mkdir(parents=True, exist_ok=True)
    project = yaml.safe_load((toolchain.PROJECT_DIR / "Pulumi.yaml").read_text())
    project["main"] = str(toolchain.PROJECT_DIR)
    # Pulumi.yaml's virtualenv is relative to the project file: here, the checkout's.
    project["runtime"]["options"]["virtualenv"] = str(toolchain.PROJECT_DIR / ".venv")
    (work / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    return work


def _pulumi(work_dir: Path, *args: str, capture: bool = False) -> str:
    """Run the CLI in ``work_dir``; its progress goes to stderr (stdout is the demo's result)."""
    _log("pulumi " + " ".join(args))
    env = {**os.environ, **localenv.pulumi_env()}
    result = subprocess.run(
        [str(toolchain.bin_path("pulumi")), *args],
        cwd=work_dir,
        env=env,
        check=True,
        text=True,
        stdout=subprocess.PIPE if capture else sys.stderr,
    )
    return result.stdout if capture else ""


def deploy(real_node: bool = False) -> list[str]:
    """`pulumi up` the local stack with the CLI; return the names of the Deployment CRs.

    ``real_node`` adds :func:`realnode.reporter_patch` to each deployment's ``patches``.
    """
    from tools import pulumi_stack

    localenv.apply_pulumi_env()
    work_dir = _project_dir()
    _pulumi(work_dir, "stack", "select", "--create", STACK)
    settings = yaml.safe_load((toolchain.PROJECT_DIR / f"Pulumi.{STACK}.yaml").read_text())
    # The committed config, keeping the salt `stack select --create` wrote into the copy.
    if real_node:
        for dep in settings["config"].get("pmem-csi:deployments") or []:
            dep["patches"] = [*(dep.get("patches") or []), realnode.reporter_patch()]
    pulumi_stack.write_stack_config(work_dir, STACK, settings["config"])
    # --refresh: after `make cluster-stop` the state still lists objects of the old cluster.
    _pulumi(work_dir, "up", "--yes", "--refresh", "--stack", STACK)
    outputs = json.loads(_pulumi(work_dir, "stack", "output", "--json", capture=True))
    return list(outputs.get("deployments") or {})


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


def _node_pods() -> list[dict]:
    selector = f"spec.nodeName={realnode.NODE_NAME}"
    return json.loads(_kubectl("get", "pods", "-A", "--field-selector", selector, "-o", "json"))[
        "items"
    ]


def _pod_ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod.get("status", {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def wait_reporter_pods(names: list[str], timeout: float = 300) -> None:
    """Wait until the reporter's pods on the real node are Ready and every CR has a phase."""
    _log(f"waiting for the reporter's pods on {realnode.NODE_NAME} and the CRs' status")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = _node_pods()
        items = json.loads(_kubectl("get", CR_RESOURCE, "-o", "json"))["items"]
        if (
            pods
            and all(_pod_ready(p) for p in pods)
            and items
            and all(i.get("status", {}).get("phase") for i in items)
        ):
            return
        time.sleep(1)
    _log(f"not there within {timeout:.0f}s; the pods' logs are in {realnode.pod_log_dir()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__)
    parser.add_argument(
        "--no-real-node", action="store_true", help="run the reporter as a local process"
    )
    args = parser.parse_args(argv)
    real_node = not args.no_real_node
    t0 = time.monotonic()
    toolchain.build_all()
    cluster.start(real_node=real_node)
    names = deploy(real_node=real_node)
    missing = []
    if real_node:
        wait_reporter_pods(names)
        print(f"reporter pods on the real node {realnode.NODE_NAME} (under its kubelet):")
        selector = f"spec.nodeName={realnode.NODE_NAME}"
        print(_kubectl("get", "pods", "-A", "-o", "wide", "--field-selector", selector))
        print("the reporters' Leases (held by a pod above):")
        print(_kubectl("get", "leases", "-A", "-o", "custom-columns="
                       "NAMESPACE:.metadata.namespace,LEASE:.metadata.name,"
                       "HOLDER:.spec.holderIdentity", "--field-selector",
                       "metadata.namespace!=kube-node-lease,"
                       "metadata.namespace!=kube-system"))  # fmt: skip
    else:
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

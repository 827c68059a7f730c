"""The README's two commands in one clone: `make demo`, then `make test`, then the demo again.

The demo runs in a state directory standing for a newcomer's ``.state/`` and leaves its cluster
and its `local` stack running, as `make demo` does. Then the suite's README flow
(``test_cli.py::test_readme_blocks_deploy_check_and_remove``, the README's defaults: the same
driver name and namespace as the demo's) runs in a pytest session of its own with that same
``PMEM_CSI_STATE_DIR``, exactly as `make test` would in that clone. It must pass, and must leave
every object of the demo's cluster as it was (same resourceVersion). Then the demo runs once
more, as a newcomer repeating the command would. (In a session that collects both, the README
flow runs only here: ``tests/conftest.py``, ``NESTED_IN``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import README_FLOW
from tools import localenv, realnode, toolchain

# The demo twice and a nested session that starts a cluster of its own.
pytestmark = pytest.mark.timeout(2700)

CR_RESOURCE = "deployments.pmem-csi.intel.com"
# What the demo's stack owns, and the kinds a stray update of another stack would touch.
WATCHED = (
    "namespaces",
    "customresourcedefinitions",
    CR_RESOURCE,
    "csidrivers",
    "clusterroles",
    "clusterrolebindings",
    "daemonsets",
    "statefulsets",
    "deployments.apps",
    "services",
    "secrets",
    "serviceaccounts",
    "roles",
    "rolebindings",
)


def _run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.demo"],
        cwd=toolchain.PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _assert_demo_reports_running(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-4000:]
    # The administrator's commands, with the CLI's own progress output (on stderr).
    assert "pulumi stack select --create local" in result.stderr
    assert "Updating (local):" in result.stderr, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    # First the reporter's pods, Running and Ready under the real node's kubelet, and the
    # Lease held by one of them (identity <pod name>_<pid>, pid 1 in its container).
    assert lines[0] == f"reporter pods on the real node {realnode.NODE_NAME} (under its kubelet):"
    header = lines[1]

    def column(row: str, name: str) -> str:  # kubectl's columns are aligned to the header
        return row[header.index(f" {name} ") + 1 :].split()[0]

    pods = [
        {c: column(line, c) for c in ("NAME", "READY", "STATUS", "NODE")} for line in lines[2:4]
    ]
    assert [(p["READY"], p["STATUS"], p["NODE"]) for p in pods] == [
        ("1/1", "Running", realnode.NODE_NAME)
    ] * 2, lines[:5]
    assert all("reporter" in p["NAME"] for p in pods)
    leases = lines[lines.index("the reporters' Leases (held by a pod above):") + 2 :]
    holders = {line.split()[1]: line.split()[-1] for line in leases[: leases.index("")]}
    holder = holders["pmem-csi-intel-com-reporter"]
    assert holder.rsplit("_", 1)[0] in {p["NAME"] for p in pods}, lines
    lines = lines[lines.index(next(x for x in lines if x.startswith("NAME "))) :]
    assert lines[0].split() == ["NAME", "DEVICEMODE", "NODESELECTOR", "IMAGE", "STATUS", "AGE"]
    row = lines[1].split()
    assert row[:5] == [
        "pmem-csi.intel.com",
        "lvm",
        '{"storage":"pmem"}',
        "intel/pmem-csi-driver:canary",
        "Running",
    ]
    marker = "status of pmem-csi.intel.com:\n"
    status = json.loads(result.stdout[result.stdout.index(marker) + len(marker) :])
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "CertsReady": "True",
        "CertsVerified": "True",
        "DriverDeployed": "True",
    }


def _identities(kubeconfig: Path) -> dict[tuple[str, str, str, str], tuple[str, str]]:
    """(apiVersion, kind, namespace, name) -> (uid, what a writer of the object would change).

    That is the generation for objects that have one (their status, which the demo's reporter
    pods keep writing while they run, does not count), else the resourceVersion.
    """
    out = subprocess.run(
        [
            str(toolchain.bin_path("kubectl")),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            ",".join(WATCHED),
            "--all-namespaces",
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    found = {}
    for item in items:
        meta = item["metadata"]
        key = (item["apiVersion"], item["kind"], meta.get("namespace", ""), meta["name"])
        found[key] = (meta["uid"], str(meta.get("generation") or meta["resourceVersion"]))
    return found


def test_demo_then_the_suites_readme_flow_in_one_clone_then_the_demo_again(
    local_cluster: Path, real_node_free: None, tmp_path: Path
) -> None:
    # local_cluster: only for its CI semantics (tools present, cluster startable).
    state = tmp_path / "state"  # the newcomer's `.state/`
    session = state / localenv.TEST_SESSION_SUBDIR
    # A newcomer's shell: none of this session's own settings.
    own = ("KUBECONFIG", "PMEM_CSI_TEST_SESSION", "PMEM_CSI_TEST_WORKER", "PMEM_CSI_KEEP_CLUSTER")
    env = {
        k: v for k, v in os.environ.items() if k not in own and not k.startswith("PYTEST_XDIST")
    }
    env["PMEM_CSI_STATE_DIR"] = str(state)
    demo_kubeconfig = state / "kubeconfig"
    try:
        first = _run_demo(env)
        _assert_demo_reports_running(first)
        # The committed stack file is never rewritten (no encryptionsalt of this state dir).
        assert "encryptionsalt" not in (toolchain.PROJECT_DIR / "Pulumi.local.yaml").read_text()
        before = _identities(demo_kubeconfig)
        cr = ("pmem-csi.intel.com/v1beta1", "Deployment", "", "pmem-csi.intel.com")
        node_ds = ("apps/v1", "DaemonSet", "pmem-csi", "pmem-csi-intel-com-node")
        assert cr in before and node_ds in before, sorted(before)

        suite = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                README_FLOW,
            ],
            cwd=toolchain.PROJECT_DIR,
            env={**env, "PMEM_CSI_REQUIRE_CLUSTER": "1"},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        report = suite.stdout[-6000:] + suite.stderr[-2000:]
        assert suite.returncode == 0, report
        assert "1 passed" in suite.stdout, report
        # Its own cluster and backend, inside the demo's state directory, and stopped after it.
        assert (session / "pulumi-backend").is_dir(), report
        assert not (session / "kubeconfig").exists(), report

        after = _identities(demo_kubeconfig)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert changed == [], changed

        again = _run_demo(env)
        _assert_demo_reports_running(again)
    finally:
        # The nested session's cluster too, should that session have been killed.
        for state_dir in (session, state):
            subprocess.run(
                [sys.executable, "-m", "tools.cluster", "stop"],
                cwd=toolchain.PROJECT_DIR,
                env={**env, "PMEM_CSI_STATE_DIR": str(state_dir)},
                capture_output=True,
                timeout=120,
            )

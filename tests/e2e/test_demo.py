"""The README's main job, `make demo` (python -m tools.demo), works from an empty state.

It runs in a state directory of its own, so it starts its own local cluster and its own
`local` stack and cannot disturb (or be disturbed by) the other end-to-end tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tools import toolchain


def test_demo_deploys_the_local_stack_and_reports_running(
    local_cluster: Path, tmp_path: Path
) -> None:
    # local_cluster: only for its CI semantics (tools present, cluster startable).
    env = {**os.environ, "PMEM_CSI_STATE_DIR": str(tmp_path / "state")}
    env.pop("KUBECONFIG", None)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tools.demo"],
            cwd=toolchain.PROJECT_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        # The administrator's commands, with the CLI's own progress output (on stderr).
        assert "pulumi stack select --create local" in result.stderr
        assert "Updating (local):" in result.stderr, result.stderr[-4000:]
        assert "Traceback" not in result.stderr, result.stderr[-4000:]
        lines = result.stdout.splitlines()
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
        # The committed stack file is never rewritten (no encryptionsalt of this state dir).
        assert "encryptionsalt" not in (toolchain.PROJECT_DIR / "Pulumi.local.yaml").read_text()
    finally:
        subprocess.run(
            [sys.executable, "-m", "tools.cluster", "stop"],
            cwd=toolchain.PROJECT_DIR,
            env=env,
            capture_output=True,
            timeout=120,
        )

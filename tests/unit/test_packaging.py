"""The reporter is runnable as the console script that pyproject.toml declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_console_script_runs_the_reporter_cli() -> None:
    script = Path(sys.executable).parent / "pmem-csi-reporter"
    assert script.exists(), f"{script} missing: install the project (make installs it with -e)"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--deployment" in result.stdout
    assert "deployments.pmem-csi.intel.com" in result.stdout

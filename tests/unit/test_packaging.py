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


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_reporter_image_pins_match_the_project_pins() -> None:
    root = Path(__file__).resolve().parents[2]
    reporter_pins = _pins(root / "reporter" / "requirements.txt")
    project_pins = _pins(root / "requirements.txt")
    assert reporter_pins
    assert {k: project_pins.get(k) for k in reporter_pins} == reporter_pins


def test_reporter_imports_nothing_outside_its_image_requirements() -> None:
    """The reporter image installs only reporter/requirements.txt (pydantic and PyYAML come
    with the kubernetes client); the program's packages and modules stay out."""
    code = (
        "import pkgutil, sys, importlib, reporter\n"
        "for m in pkgutil.iter_modules(reporter.__path__):\n"
        "    importlib.import_module('reporter.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in {'pulumi', 'jsonpatch',"
        " 'pulumi_kubernetes'} or n in {'pmem_components.config', 'pmem_components.patches'})\n"
        "print(','.join(bad))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""

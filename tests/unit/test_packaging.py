"""The reporter is runnable as the console script that pyproject.toml declares."""

from __future__ import annotations

import shutil
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


def test_the_crd_ships_in_the_wheel_and_install_crd_finds_it(tmp_path: Path) -> None:
    """Built with ``pip wheel --no-deps`` and imported straight from the zip (zipimport):
    nothing of the checkout is on the path, so the CRD can only come from package data."""
    root = Path(__file__).resolve().parents[2]
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(root / "pyproject.toml", src)
    for part in ("pmem_components", "reporter", "crd"):
        shutil.copytree(root / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run(
        # No build isolation: the build backend is the venv's pinned setuptools
        # (requirements-dev.txt), not whatever version an isolated build would download.
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("pmem_csi_pulumi-*.whl")
    code = (
        "import sys\n"
        f"sys.path = [p for p in sys.path if p.rstrip('/') != {str(root)!r}]\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.path.insert(0, {str(wheel)!r})\n"
        "import pmem_components\n"
        "assert pmem_components.__file__.startswith(sys.path[0]), pmem_components.__file__\n"
        "from pmem_components.manifests.crd import load_crd\n"
        "from pmem_components.components import install_crd\n"
        "crd = load_crd()\n"
        "print(crd['metadata']['name'], callable(install_crd))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["deployments.pmem-csi.intel.com", "True"]

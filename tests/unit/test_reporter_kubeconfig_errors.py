"""A reporter started with a bad kubeconfig says why in one line and exits 2, no traceback.

Why it matters: in a crash-looping pod the last log line is what ``kubectl logs`` shows first;
a Python traceback buries the reason (and the client's own message for a missing file,
"No configuration found", names the wrong problem).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reporter.__main__ import main

PROJECT_DIR = Path(__file__).resolve().parents[2]


def run_main(capsys: pytest.CaptureFixture[str], kubeconfig: Path) -> tuple[int, str]:
    code = main(["--kubeconfig", str(kubeconfig), "--deployment", "x", "--metrics-port", "0"])
    return code, capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(capsys, tmp_path / "nope")
    assert code == 2
    assert err.strip().splitlines() == [
        f"pmem-csi-reporter: error: cannot read kubeconfig {tmp_path / 'nope'}: "
        "No such file or directory"
    ]


def test_directory_instead_of_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(capsys, tmp_path)
    assert code == 2
    assert "cannot read kubeconfig" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content", ["garbage: [\n", "apiVersion: v1\nkind: Config\n", "- just\n- a list\n"]
)
def test_invalid_content(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    code, err = run_main(capsys, path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"pmem-csi-reporter: error: invalid kubeconfig {path}: ")


def test_python_dash_m_prints_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reporter", "--kubeconfig", str(tmp_path / "nope")],
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("pmem-csi-reporter: error: cannot read kubeconfig")

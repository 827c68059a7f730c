"""What a CI run refuses (tests/conftest.py ``pytest_sessionfinish`` and pyproject.toml).

Each case runs pytest as a subprocess over one tiny test file, with the project's pytest
settings (``-c pyproject.toml``) and its conftest hooks (``-p tests.conftest``), so what is
checked is the rule the suite itself runs under, not a copy of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]

PASSES = "def test_passes():\n    assert True\n"
CASES = {
    "skip": "import pytest\n\ndef test_skipped():\n    pytest.skip('no tool')\n",
    "xfail-call": "import pytest\n\ndef test_expected_to_fail():\n    pytest.xfail('known')\n",
    "xfail-marker": (
        "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_fails():\n    assert False\n"
    ),
    "xpass-non-strict": (
        "import pytest\n\n@pytest.mark.xfail(reason='known', strict=False)\n"
        "def test_passes_anyway():\n    assert True\n"
    ),
}


def _pytest(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_case.py"
    test_file.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PMEM_CSI_REQUIRE_CLUSTER")}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(PROJECT_DIR / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(test_file),
        ],
        cwd=PROJECT_DIR,  # `tests.conftest` is imported from the checkout
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_ci_fails_a_run_with_a_skipped_or_expected_to_fail_test(tmp_path: Path, case: str) -> None:
    result = _pytest(tmp_path, PASSES + "\n\n" + CASES[case], ci=True)
    out = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "failing the run" in result.stderr, out


def test_ci_passes_a_run_where_every_test_passed(tmp_path: Path) -> None:
    """The counterpart: the hook fails runs for what they contain, not every run."""
    result = _pytest(tmp_path, PASSES, ci=True)
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr


def test_outside_ci_an_expected_failure_does_not_fail_the_run(tmp_path: Path) -> None:
    """On a laptop without the toolchain the e2e tests skip; the rule is CI's alone."""
    result = _pytest(tmp_path, PASSES + "\n\n" + CASES["xfail-marker"], ci=False)
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "1 xfailed" in result.stdout, result.stdout


def test_an_xfail_marker_whose_test_passes_fails_the_run_anywhere(tmp_path: Path) -> None:
    """``xfail_strict = true``: a test that no longer fails is reported, not kept as xpassed."""
    source = "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_passes():\n    pass\n"
    result = _pytest(tmp_path, source, ci=False)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert "XPASS(strict)" in result.stdout, result.stdout


def test_no_two_test_modules_share_a_name() -> None:
    """tests/ has no __init__.py: two test_x.py in tests/unit and tests/e2e stop the whole
    collection ("import file mismatch"), as happened twice."""
    names = [p.name for p in (PROJECT_DIR / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []

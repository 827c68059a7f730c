"""How `make test` splits the suite over pytest-xdist workers (tests/conftest.py).

Each worker is a session of its own, with its own state directory (so its own cluster and
backend); a module runs whole on one worker; the modules that use the machine's one real node
all run on the same worker; CI's refusal of skipped tests holds under xdist too. The cases run
pytest as a subprocess with the project's settings and conftest hooks, as test_ci_rules.py does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import README_FLOW, REAL_NODE_GROUP, nested_elsewhere, work_unit

PROJECT_DIR = Path(__file__).resolve().parents[2]

RECORDS = """\
import json, os

def _record(name):
    with open(os.environ["RECORDS"], "a") as out:
        out.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER"),
                              os.environ["PMEM_CSI_STATE_DIR"],
                              os.environ.get("PMEM_CSI_TEST_WORKER")]) + "\\n")
"""


def _pytest(
    tmp_path: Path, *args: str, env: dict[str, str], xdist: bool = True
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", "PMEM_CSI_REQUIRE_CLUSTER", "PMEM_CSI_TEST_SESSION")
        and not k.startswith(("PYTEST_XDIST", "PMEM_CSI_TEST_WORKER"))
    }
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
            *(["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"] if xdist else []),
            *args,
        ],
        cwd=PROJECT_DIR,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_module_is_one_work_unit_and_the_real_node_modules_share_one() -> None:
    assert work_unit("tests/e2e/test_day2.py::test_x") == "tests/e2e/test_day2.py"
    assert work_unit("tests/e2e/test_day2.py::TestA::test_y[1]") == "tests/e2e/test_day2.py"
    assert work_unit("tests/e2e/test_real_node.py::test_z") == REAL_NODE_GROUP
    assert work_unit("tests/e2e/test_demo.py::test_demo") == REAL_NODE_GROUP


def test_workers_have_state_directories_of_their_own_modules_stay_whole_and_ci_refuses_skips(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for module in ("one", "two"):
        (work / f"test_{module}.py").write_text(
            RECORDS
            + "".join(f"\ndef test_{module}_{i}():\n    _record('{module}')\n" for i in range(3))
        )
    (work / "test_skips.py").write_text(
        "import pytest\n\ndef test_skipped():\n    pytest.skip('no tool')\n"
    )
    records = tmp_path / "records.jsonl"
    state = tmp_path / "state"
    env = {"RECORDS": str(records), "PMEM_CSI_STATE_DIR": str(state), "CI": "true"}
    result = _pytest(work, str(work), env=env)
    out = result.stdout + result.stderr
    # CI refuses the skip on whichever worker it ran.
    assert result.returncode != 0, out
    assert "6 passed, 1 skipped" in out, out
    assert "CI: 1 skipped; failing the run" in result.stderr, out
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == 6
    by_module: dict[str, set[str]] = {}
    for module, worker, state_dir, marked in rows:
        by_module.setdefault(module, set()).add(worker)
        # The worker's own directory inside the session's, which is inside the administrator's.
        assert state_dir == str(state / "test-session" / worker)
        assert marked == worker
    assert all(len(workers) == 1 for workers in by_module.values()), by_module


def test_a_real_node_test_outside_the_listed_modules_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_sneaky.py").write_text("def test_uses_the_node(real_node_free):\n    pass\n")
    result = _pytest(work, "--collect-only", str(work), env={"PMEM_CSI_STATE_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "test_sneaky.py::test_uses_the_node uses the real node" in result.stderr, (
        result.stdout + result.stderr
    )


def test_the_suite_runs_without_xdist_too(tmp_path: Path) -> None:
    """``-p no:xdist``: the scheduler hook is optional, so pytest does not refuse it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_one.py").write_text("def test_passes():\n    assert True\n")
    result = _pytest(
        work, "-p", "no:xdist", str(work), env={"PMEM_CSI_STATE_DIR": str(tmp_path / "s")},
        xdist=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_readme_flow_runs_once_inside_test_demo_when_both_are_collected() -> None:
    demo = "tests/e2e/test_demo.py::test_demo_then_the_suites_readme_flow_in_one_clone"
    other = "tests/e2e/test_cli.py::test_preview_names_what_changes"
    assert nested_elsewhere([README_FLOW, demo, other]) == {README_FLOW}
    # Run alone (or with other modules but not test_demo), the flow runs as itself.
    assert nested_elsewhere([README_FLOW, other]) == set()
    assert nested_elsewhere([demo]) == set()


def test_test_demo_runs_the_readme_flow_it_stands_for() -> None:
    """The nested session runs exactly the test that the outer session leaves out."""
    source = (PROJECT_DIR / "tests/e2e/test_demo.py").read_text()
    assert "README_FLOW," in source
    assert README_FLOW.split("::")[1] in (PROJECT_DIR / "tests/e2e/test_cli.py").read_text()

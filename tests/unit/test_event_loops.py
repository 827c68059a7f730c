"""No unit test depends on the event loop or the Pulumi state an earlier test left behind.

tests/unit/conftest.py gives every unit test a fresh, current event loop and the Pulumi SDK's
state as at import (no mocks, no root stack), and closes the loop after the test. Without it,
a test run after ``asyncio.run`` (test_provider_face, test_takeover_transform_mutants) found no
current loop, one run after test_takeover_cluster found a closed loop, and one run on another
loop than the one ``set_mocks`` had made the root stack on reused that stack's futures; which
tests broke depended on the order and on the xdist worker. The last case runs such a sequence
of tests from several modules in one pytest session of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pulumi
from pulumi.runtime import settings as pulumi_settings
from pulumi_mocks import RecordingMocks

PROJECT_DIR = Path(__file__).resolve().parents[2]
THIS = "tests/unit/test_event_loops.py"
# Set in the nested session: the case that starts it must not run there (no recursion).
NESTED = "PMEM_CSI_EVENT_LOOPS_NESTED"

# Tests of several modules, in an order that broke three ways before: each leaves behind what
# the next one tripped over.
SEQUENCE = (
    # asyncio.run: no current loop left; the first set_mocks, which makes the root stack,
    # failed ("There is no current event loop").
    "tests/unit/test_provider_face.py::test_plain_nested_inputs_map_unchanged",
    "tests/unit/test_reporter_per_stack.py::"
    "test_the_program_registers_one_reporter_for_all_deployments",
    # A loop of its own, closed and left current: the mocks then failed ("Event loop is
    # closed").
    "tests/unit/test_takeover_cluster.py::test_the_default_provider_is_the_stack_config",
    "tests/unit/test_cert_resource.py::test_generated_set_is_wired_and_keys_are_secret",
    # The root stack made on one loop and never run there; a later set_mocks kept it, and the
    # mocks on another loop waited for it ("attached to a different loop"; here the Python
    # process even crashed).
    "tests/unit/test_takeover_adopted.py::test_an_adopted_workload_keeps_only_this_stacks_manager",
    f"{THIS}::test_mocks_set_but_never_run",
    f"{THIS}::test_a_test_starts_with_an_open_current_loop_and_no_pulumi_state",
    "tests/unit/test_takeover_transform_mutants.py::"
    "test_namespaces_and_the_crd_are_never_taken_over[crd-up]",
    "tests/unit/test_components.py::test_stack_outputs",
    "tests/unit/test_program_mutants.py::test_the_crd_and_namespaces_are_kept_on_delete_by_default",
)


def test_a_test_starts_with_an_open_current_loop_and_no_pulumi_state() -> None:
    loop = asyncio.get_event_loop()
    assert not loop.is_closed()
    assert not loop.is_running()
    assert pulumi.runtime.get_root_resource() is None
    assert pulumi_settings.SETTINGS.monitor is None


def test_mocks_set_but_never_run() -> None:
    """Leaves the SDK with a root stack whose registration never ran (SEQUENCE's first)."""
    pulumi.runtime.set_mocks(RecordingMocks({}), preview=False)
    assert pulumi.runtime.get_root_resource() is not None


def test_tests_that_leave_loops_and_mocks_behind_break_no_later_test() -> None:
    assert os.environ.get(NESTED) != "1", "started inside its own nested session"
    assert not [t for t in SEQUENCE if "break_no_later_test" in t]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"))
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:randomly",
            *SEQUENCE,
        ],
        cwd=PROJECT_DIR,
        env={**env, NESTED: "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert f"{len(SEQUENCE)} passed" in report, report

"""Shared pytest fixtures: the local cluster (once per session) and Pulumi stacks per test.

In CI (``CI=true``) a missing tool or a cluster that does not start fails the tests that need
it, with the reason; elsewhere those tests are skipped so unit tests stay usable on a laptop
without the toolchain. A CI run that skipped anything, or had a test expected to fail, is failed
at the end of the session.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from tools import cluster, localenv, postgres, realnode, toolchain  # noqa: E402

# The test session's own state directory, inside the administrator's (``.state/`` or
# PMEM_CSI_STATE_DIR) but never equal to it: the tests start their own local cluster, with
# their own Pulumi backend, next to whatever `make demo` or an administrator's local stack left
# running there. Set before any fixture runs, so every helper that asks `localenv` (this
# process and its children: the CLI, the reporter, nested tools) sees the same directory.
# PMEM_CSI_TEST_SESSION marks the directory as already chosen (a child pytest of this session).
if os.environ.get("PMEM_CSI_TEST_SESSION") != "1":
    os.environ["PMEM_CSI_STATE_DIR"] = str(localenv.state_dir() / localenv.TEST_SESSION_SUBDIR)
    os.environ["PMEM_CSI_TEST_SESSION"] = "1"
# `make test` runs the suite in pytest-xdist workers (``-n 3``): each worker is a session of its
# own, with its own state directory inside the session's (``test-session/gw0``), so its own
# cluster and backend; no two workers share a cluster, a stack or an object name.
# PMEM_CSI_TEST_WORKER marks that directory as chosen, for the worker's child processes.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and os.environ.get("PMEM_CSI_TEST_WORKER") != _WORKER:
    os.environ["PMEM_CSI_STATE_DIR"] = str(localenv.state_dir() / _WORKER)
    os.environ["PMEM_CSI_TEST_WORKER"] = _WORKER
# Never the administrator's (or the demo's) cluster or secrets: until `local_cluster` names the
# session's cluster, a client that looks for a kubeconfig finds none (an unset KUBECONFIG
# would make it fall back to ~/.kube/config); Pulumi would prefer a passphrase in the
# environment to the session's passphrase file.
os.environ["KUBECONFIG"] = str(localenv.state_dir() / "no-cluster-yet" / "kubeconfig")
for _var in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN", "PULUMI_BACKEND_URL"):
    os.environ.pop(_var, None)

IN_CI = any(
    os.environ.get(var, "").lower() in {"1", "true", "yes"}
    for var in ("CI", "PMEM_CSI_REQUIRE_CLUSTER")
)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"local cluster unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"local cluster unavailable: {reason} (run 'make tools')")


# How `make test` spreads the suite over pytest-xdist workers (``-n 3 --dist loadscope``): each
# worker takes whole modules (a module's module-scoped fixtures are set up once), and the modules
# that use the machine's one real node (tools/realnode.py) all go to one worker, one after the
# other. The list is checked at collection: a test elsewhere that uses the node fails there.
REAL_NODE_GROUP = "real-node"
REAL_NODE_MODULES = ("tests/e2e/test_real_node.py", "tests/e2e/test_demo.py")
# Modules that take minutes, first in the queue, so the workers end at about the same time
# (``--no-loadscope-reorder`` hands out modules in collection order). Only the order depends on
# this list, never a result.
LONGEST_FIRST = (
    REAL_NODE_GROUP,
    "tests/e2e/test_day2.py",
    "tests/e2e/test_one_cluster.py",
    "tests/e2e/test_cli.py",
    "tests/e2e/test_operator_scenarios.py",
    "tests/e2e/test_program.py",
    "tests/e2e/test_reporter.py",
    "tests/e2e/test_cli_interruptions.py",
    "tests/e2e/test_drift.py",
)


def work_unit(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's module, or
    :data:`REAL_NODE_GROUP` for the modules in :data:`REAL_NODE_MODULES`."""
    module = nodeid.split("::", 1)[0]
    return REAL_NODE_GROUP if module in REAL_NODE_MODULES else module


def _queue_rank(nodeid: str) -> int:
    unit = work_unit(nodeid)
    return LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with :func:`work_unit` as the scope."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the e2e tests, refuse a real-node test outside :data:`REAL_NODE_MODULES`, leave out
    a test that another collected test runs itself (:data:`NESTED_IN`), and put the long work
    units first (stable: otherwise the collection order stays)."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module.startswith("tests/e2e/"):
            item.add_marker(pytest.mark.e2e)
        if "real_node_free" in getattr(item, "fixturenames", ()) and module not in (
            REAL_NODE_MODULES
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the real node: add {module} to REAL_NODE_MODULES in "
                "tests/conftest.py (one xdist worker runs those modules, one at a time)"
            )
    nested = nested_elsewhere(item.nodeid for item in items)
    if nested:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in nested])
        items[:] = [i for i in items if i.nodeid not in nested]
    items.sort(key=lambda i: _queue_rank(i.nodeid))


# Tests that another test of the suite runs whole, in a pytest session of its own: test_demo.py
# runs the README flow of test_cli.py next to the demo's cluster (the README's two commands in
# one clone, issue 17). When both are collected, the flow runs once, inside test_demo (its
# failure fails test_demo with the nested session's report); run alone it runs as itself.
README_FLOW = "tests/e2e/test_cli.py::test_readme_blocks_deploy_check_and_remove"
NESTED_IN = {README_FLOW: "tests/e2e/test_demo.py"}


def nested_elsewhere(nodeids: Iterable[str]) -> set[str]:
    """The collected tests that a collected test of :data:`NESTED_IN` runs itself."""
    ids = set(nodeids)
    modules = {nodeid.split("::", 1)[0] for nodeid in ids}
    return {test for test, runner in NESTED_IN.items() if test in ids and runner in modules}


# Outcomes that are not a pass: a test skipped, or expected to fail (``pytest.xfail`` or an
# ``xfail`` marker), whether it then failed or (non-strict) passed.
NOT_PASSED = ("skipped", "xfailed", "xpassed")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped or expected-to-fail test is not a passed test."""
    if not IN_CI:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {o: len(reporter.stats.get(o, [])) if reporter else 0 for o in NOT_PASSED}
    if sum(counts.values()) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        seen = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
        print(f"\nCI: {seen}; failing the run", file=sys.stderr)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Path]:
    """Kubeconfig of the local cluster, started for this session and stopped after it."""
    missing = [g for g in toolchain.missing() if g in ("kubernetes", "etcd", "kwok")]
    if missing:
        _unavailable(f"tool group(s) not built: {', '.join(missing)}")
    # One session at a time in a state directory: a second one would share (and then stop)
    # this session's cluster.
    lock = os.open(localenv.state_dir() / "session.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pytest.fail(
            f"another test session runs with the state directory {localenv.state_dir()}; "
            "wait for it, or give this one another PMEM_CSI_STATE_DIR",
            pytrace=False,
        )
    if not cluster.is_running():
        # Stacks a killed earlier session left in this backend describe a cluster that is gone.
        shutil.rmtree(localenv.state_dir() / "pulumi-backend", ignore_errors=True)
    try:
        kubeconfig = cluster.start()
    except Exception as err:  # the reason must reach the test report
        _unavailable(f"cluster start failed: {err}")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    yield kubeconfig
    # Also a cluster an earlier session kept or left behind when it was killed: `make test`
    # ends with no cluster of its own running unless asked to keep it.
    if not os.environ.get("PMEM_CSI_KEEP_CLUSTER"):
        cluster.stop()
    os.close(lock)


@pytest.fixture(scope="session")
def real_node_free(local_cluster: Path) -> Iterator[None]:
    """The machine's one real node (tools/realnode.py) free for this session, given back after.

    A `make demo` left running in the administrator's state directory holds the node. The
    session stops that node (the demo's cluster keeps running; its reporter pods wait for the
    node) and at the end joins it to the demo's cluster again, with the reporter image.
    """
    record = realnode.Record.load()
    holder = None
    if record and realnode.is_running() and record.state_dir != str(localenv.state_dir()):
        holder = record.state_dir
    if holder:
        print(f"\n[tests] borrowing the real node of {holder} until the end of the session")
        _node_command(holder, "tools.realnode", "stop")
    yield
    if holder and (Path(holder) / "kubeconfig").exists():
        print(f"\n[tests] giving the real node back to {holder}")
        _node_command(holder, "tools.cluster", "start", "--real-node")


def _node_command(state_dir: str, module: str, *args: str) -> None:
    own = ("PMEM_CSI_STATE_DIR", "PMEM_CSI_TEST_SESSION", "KUBECONFIG")
    env = {k: v for k, v in os.environ.items() if k not in own}
    subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=PROJECT_DIR,
        env={**env, "PMEM_CSI_STATE_DIR": state_dir},
        check=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Login URL of a local PostgreSQL server (a team's state backend), stopped after the session.

    Its data lives in the session's state directory; ``postgresql`` is installed with apt-get
    when missing (tools/postgres.py). The password is in :func:`postgres.client_env`.
    """
    started_here = not postgres.is_running()
    try:
        url = postgres.start()
    except Exception as err:  # the reason must reach the test report
        _unavailable(f"PostgreSQL start failed: {err}")
    yield url
    if started_here and not os.environ.get("PMEM_CSI_KEEP_CLUSTER"):
        postgres.stop()


@pytest.fixture(scope="session")
def pulumi_ready(local_cluster: Path) -> dict[str, str]:
    """The offline Pulumi environment, with the locally built CLI and provider."""
    missing = [g for g in toolchain.missing() if g in ("pulumi", "pulumi-kubernetes")]
    if missing:
        _unavailable(f"tool group(s) not built: {', '.join(missing)}")
    return localenv.apply_pulumi_env()


@pytest.fixture(scope="session")
def api_client(local_cluster: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(local_cluster))


@pytest.fixture(scope="session")
def kubectl(local_cluster: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the locally built kubectl against the local cluster."""
    binary = str(toolchain.bin_path("kubectl"))

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary, "--kubeconfig", str(local_cluster), *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture
def pulumi_stack(pulumi_ready: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: ``pulumi_stack(program, config=..., secret_config=...)`` -> auto.Stack.

    Each stack gets its own project directory and a unique name; every stack made by the test
    is destroyed and removed afterwards, even when the test failed.
    """
    from tools import pulumi_stack as ps

    made: list[Any] = []

    def make(
        program: Callable[[], None],
        config: dict[str, Any] | None = None,
        secret_config: dict[str, str] | None = None,
        name: str | None = None,
    ) -> Any:
        stack_name = name or f"t{uuid.uuid4().hex[:8]}"
        stack = ps.select_stack(stack_name, program, tmp_path / stack_name, config, secret_config)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        try:
            stack.destroy(on_output=ps.printer("[destroy] "))
        finally:
            stack.workspace.remove_stack(stack.name)

"""The CR, then the CRD, deleted while the reporter runs; ``pulumi up --refresh`` restores both.

Issue 10, item 4, with the real engine on the local cluster. One stack (``manageCrd: true``,
one deployment with the reporter's ServiceAccount and RBAC) and one reporter process (under
its own TokenRequest token, see ``reporter_helpers``) serve both tests, in file order:

1. The ``Deployment`` CR deleted (``kubectl delete``): the reporter stops watching for it and
   stays quiet -- it neither re-creates the CR nor writes a status for it, and sends no request
   in a loop. ``pulumi up --refresh`` creates the CR again; the same reporter process writes
   ``Running`` into it.
2. The CRD deleted (which deletes every CR): the reporter keeps running, logs once that the CRD
   is gone and that it waits, retries with backoff, is not ready (``/readyz`` 503, liveness
   200) and sets ``pmem_csi_reporter_crd_missing``. ``pulumi up --refresh`` (the stack manages
   the CRD) creates the CRD and the CR again; the same process resumes and writes ``Running``.

Deleting the CRD is cluster-wide: every ``Deployment`` CR in the cluster goes with it. The
suite runs its modules one after the other and each module creates its own CRs, so nothing else
is running then; the module leaves the CRD in place (re-created by the stack and retained on
``destroy``, or applied again by the fixture's cleanup if a test failed half way).
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import names
from pmem_components.config import DeploymentConfig
from reporter.kubeapi import RawApi
from reporter.metrics import Metrics
from reporter.observe import CR, Informer
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    condition,
    ensure_crd,
    token_kubeconfig,
)
from tests.e2e.test_program import dispose, make_stack, parsed, resource_changes, stack_config
from tests.e2e.waiting import wait_for
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(600)

STATUS_TIMEOUT = 90.0
CONDITIONS = ("CertsReady", "CertsVerified", "DriverDeployed")
CR_TYPE = f"kubernetes:{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}:{names.CRD_KIND}"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
WRITES = "pmem_csi_reporter_status_writes_total"
WRITE_ERRORS = "pmem_csi_reporter_status_write_errors_total"
RECONCILES = "pmem_csi_reporter_reconciles_total"
CR_RESTARTS = 'pmem_csi_reporter_watch_restarts_total{resource="deployments"}'
CRD_MISSING = "pmem_csi_reporter_crd_missing"
WATCHES = "pmem_csi_reporter_watches"
GONE_LINE = f"CRD {names.CRD_NAME} is gone"
BACK_LINE = f"CRD {names.CRD_NAME} is served again"
# How long the reporter is watched doing nothing for a CR that is gone: a few resync periods
# (2 s here).
QUIET_SECONDS = 8.0
# How many of its retries of the missing CRD's list the reporter is watched for.
RETRIES_WATCHED = 3


@dataclass
class Env:
    stack: auto.Stack
    cfg: DeploymentConfig
    api_client: Any
    reporter: ReporterProcess

    def cr(self) -> dict[str, Any] | None:
        try:
            return client.CustomObjectsApi(self.api_client).get_cluster_custom_object(
                names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, self.cfg.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def running(self) -> dict[str, Any]:
        """The CR once the reporter wrote Running for its current generation (else {})."""
        cr = self.cr()
        if cr is None:
            return {}
        status = cr.get("status") or {}
        fresh = status.get("observedGeneration") == cr["metadata"]["generation"]
        return cr if status.get("phase") == "Running" and fresh else {}

    def wait_running(self, what: str) -> dict[str, Any]:
        return wait_for(self.running, STATUS_TIMEOUT, f"{what}: phase Running")

    def up_refresh(self, what: str) -> auto.UpResult:
        """``pulumi up --refresh``, then wait for Running; prints how long both took."""
        start = time.monotonic()
        result = self.stack.up(refresh=True, on_output=ps.printer(f"[{what}] "))
        took = time.monotonic() - start
        self.wait_running(what)
        print(
            f"\n{what}: `pulumi up --refresh` took {took:.1f} s, "
            f"phase Running {time.monotonic() - start:.1f} s after it started"
        )
        return result

    def no_change_without_refresh(self) -> None:
        """Without --refresh Pulumi trusts its state, which still holds what was deleted."""
        preview = self.stack.preview(on_output=ps.printer("[preview] "))
        assert set(resource_changes(preview.change_summary)) == {"same"}, preview.change_summary

    def uids(self) -> dict[str, str]:
        """The driver's workloads and Secrets: what must survive untouched."""
        core = client.CoreV1Api(self.api_client)
        apps = client.AppsV1Api(self.api_client)
        n, ns = self.cfg.names, self.cfg.namespace
        return {
            "DaemonSet": apps.read_namespaced_daemon_set(n.node_driver, ns).metadata.uid,
            "StatefulSet": apps.read_namespaced_stateful_set(n.controller_driver, ns).metadata.uid,
            "registry Secret": core.read_namespaced_secret(n.registry_secret, ns).metadata.uid,
            "node Secret": core.read_namespaced_secret(n.node_secret, ns).metadata.uid,
        }


def created_lines(result: auto.UpResult) -> list[str]:
    """The ``+ TYPE NAME created`` lines of an update's output, as an administrator sees them."""
    return sorted(set(re.findall(r"\+  (\S+ \S+) created", result.stdout)))


@pytest.fixture(scope="module")
def env(
    pulumi_ready: dict[str, str],
    api_client: Any,
    local_cluster: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("crdgone")
    sfx = uuid.uuid4().hex[:6]
    raw = {"name": f"gone-{sfx}.pmem-csi.intel.com", "namespace": f"gone-{sfx}"}
    raw["reporter"] = {"image": REPORTER_IMAGE}
    cfg = parsed(raw)
    stack = make_stack(tmp, stack_config(raw, manage_crd=True))
    reporter: ReporterProcess | None = None
    try:
        stack.up(on_output=ps.printer("[up] "))
        kubeconfig = token_kubeconfig(
            api_client, local_cluster, cfg.names.reporter, cfg.namespace, tmp / "kubeconfig"
        )
        reporter = ReporterProcess(
            kubeconfig,
            cfg.name,
            cfg.namespace,
            "crdgone",
            tmp / "reporter.log",
            resync_seconds=2.0,
            # Its writes settle within 2 x max(resync, message interval) (``quiet_seconds``):
            # 4 s instead of the default interval's 20 s; nothing here is rate-limited.
            extra_args=("--message-interval", "1"),
        )
        state = Env(stack, cfg, api_client, reporter)
        state.wait_running("after up")
        yield state
    finally:
        if reporter is not None:
            reporter.stop()
            print("===== reporter log (tail) =====")
            print(reporter.log()[-6000:])
        try:
            dispose(stack)
        finally:
            ensure_crd(RawApi(api_client))  # the next modules need it, whatever happened here
            with contextlib.suppress(ApiException):  # the reporter's Events about the CR
                client.CoreV1Api(api_client).delete_collection_namespaced_event(
                    names.CLUSTER_EVENT_NAMESPACE, field_selector=f"involvedObject.name={cfg.name}"
                )


def reporter_warnings(log: str) -> list[str]:
    """The reporter's own WARNING/ERROR lines (urllib3's pool notices are not its own)."""
    return [
        line
        for line in log.splitlines()
        if re.search(r" (WARNING|ERROR|CRITICAL) reporter[.:]", line)
    ]


def _most_retries_within(seconds: float) -> int:
    """How many retries of a CR list answered 404 fit into ``seconds`` at the shortest waits
    the informer's backoff for a missing CRD draws (half of each nominal delay)."""
    backoff = Informer(None, CR, lambda *a: None, Metrics()).unserved_backoff  # type: ignore[arg-type]

    def shortest(attempt: int) -> float:  # reporter.retry.Backoff: "equal jitter"
        return min(backoff.cap, backoff.base * backoff.factor**attempt) / 2

    waited, attempt = 0.0, 0
    while waited + shortest(attempt) <= seconds:
        waited += shortest(attempt)
        attempt += 1
    return attempt


def _quiet_counts(reporter: ReporterProcess) -> dict[str, float]:
    m = reporter.metrics()
    return {k: m.get(k, 0.0) for k in (WRITES, WRITE_ERRORS, RECONCILES, CR_RESTARTS)}


def test_deleted_cr_is_left_alone_and_up_refresh_recreates_it(
    env: Env, kubectl: Callable[..., Any]
) -> None:
    rep = env.reporter
    pid = rep.pid
    old_uid = env.running()["metadata"]["uid"]
    uids = env.uids()
    mark = len(rep.log())
    kubectl("delete", f"{names.CRD_PLURAL}.{names.CRD_GROUP}", env.cfg.name, "--wait=true")
    # The reporter noticed: it stopped the watches it had for this CR.
    wait_for(
        lambda: f"no longer watching cr/{env.cfg.name}/" in rep.log(), 30, "reporter drops the CR"
    )
    # A PATCH begun before the CR went may still be counted (as a write or an error): the
    # quiet window starts once those counters have stopped moving.
    rep.settled_metrics((WRITES, WRITE_ERRORS))
    before = _quiet_counts(rep)
    time.sleep(QUIET_SECONDS)
    after = _quiet_counts(rep)

    assert rep.alive() and rep.pid == pid
    assert env.cr() is None  # not re-created by the reporter
    assert after[WRITES] == before[WRITES]  # no status for a CR that is gone
    assert after[RECONCILES] == before[RECONCILES]  # nothing computed either
    assert after[WRITE_ERRORS] == 0
    assert after[CR_RESTARTS] == before[CR_RESTARTS]  # its watch stays open, no retry loop
    assert rep.metric(WATCHES) == 1  # the CR's own watch; those of its objects are stopped
    assert rep.get("/healthz")[0] == 200 and rep.get("/readyz")[0] == 200
    assert "Traceback" not in rep.log()
    env.no_change_without_refresh()

    result = env.up_refresh("CR deleted")
    assert created_lines(result) == [f"{CR_TYPE} {env.cfg.name}"]
    assert set(resource_changes(result.summary)) == {"create", "same"}
    cr = env.running()
    assert cr["metadata"]["uid"] != old_uid
    assert all(condition(cr["status"], c).get("status") == "True" for c in CONDITIONS)
    assert rep.alive() and rep.pid == pid
    # Counted just after the PATCH that wrote Running returned: waited for, not read at once.
    wait_for(lambda: rep.metric(WRITES) > after[WRITES], 30, "the write into the new CR counted")
    assert rep.metric(WRITE_ERRORS) == 0
    assert "Traceback" not in rep.log()
    assert reporter_warnings(rep.log()[mark:]) == []
    assert env.uids() == uids


def test_deleted_crd_is_waited_for_and_up_refresh_recreates_it(
    env: Env, kubectl: Callable[..., Any]
) -> None:
    rep = env.reporter
    pid = rep.pid
    uids = env.uids()
    assert rep.get("/readyz")[0] == 200 and rep.metric(CRD_MISSING) == 0
    mark = len(rep.log())
    restarts_before = rep.metric(CR_RESTARTS)
    deleting_at = time.monotonic()  # before the deletion: the reporter's time since is shorter
    kubectl("delete", "crd", names.CRD_NAME, "--wait=true", "--timeout=60s")
    gone_at = time.monotonic()
    wait_for(lambda: GONE_LINE in rep.log(), 30, "reporter logs that the CRD is gone")
    wait_for(lambda: rep.get("/readyz")[0] == 503, 10, "reporter not ready")
    writes = rep.metric(WRITES)  # any write before the CRD went was counted long ago
    restarts_at_gone = rep.metric(CR_RESTARTS)
    # Watched for a number of its retries, not for a time: on a loaded machine a sleep can
    # hold more of them than the backoff allows in the sleep's nominal length.
    wait_for(
        lambda: rep.metric(CR_RESTARTS) - restarts_at_gone >= RETRIES_WATCHED,
        60,
        f"{RETRIES_WATCHED} retries of the CR's list while the CRD is gone",
    )

    assert rep.alive() and rep.pid == pid
    assert rep.get("/healthz")[0] == 200  # alive: a restart would not bring the CRD back
    assert rep.get("/readyz")[0] == 503
    assert rep.metric(CRD_MISSING) == 1
    assert rep.metric(WATCHES) == 1  # the CR informer, retrying; nothing else watched
    assert rep.log().count(GONE_LINE) == 1  # one line, not one per retry
    (warning,) = reporter_warnings(rep.log()[mark:])  # and no other warning
    assert GONE_LINE in warning and "waiting for the CRD to be created again" in warning
    # Backoff, not a hot loop (which would count thousands): no more attempts than its
    # shortest waits fit into the time since the deletion began (a slow machine only has
    # fewer); 2 more for the watch that ended with the CRD and the list that saw it gone.
    retries = rep.metric(CR_RESTARTS) - restarts_before
    allowed = _most_retries_within(time.monotonic() - deleting_at) + 2
    assert retries <= allowed, (retries, allowed)
    assert rep.metric(WRITES) == writes
    assert rep.metric(WRITE_ERRORS) == 0
    assert env.cr() is None
    env.no_change_without_refresh()

    result = env.up_refresh("CRD deleted")
    assert created_lines(result) == sorted(
        [f"{CRD_TYPE} {names.CRD_NAME}", f"{CR_TYPE} {env.cfg.name}"]
    )
    assert set(resource_changes(result.summary)) == {"create", "same"}
    cr = env.running()
    assert all(condition(cr["status"], c).get("status") == "True" for c in CONDITIONS)
    assert rep.alive() and rep.pid == pid
    assert rep.log().count(BACK_LINE) == 1
    assert rep.get("/readyz")[0] == 200
    assert rep.metric(CRD_MISSING) == 0
    assert rep.metric(WRITE_ERRORS) == 0
    assert "Traceback" not in rep.log()
    assert len(reporter_warnings(rep.log()[mark:])) == 1  # the CRD's return is no warning
    assert env.uids() == uids
    # Figures for docs/faults.md: requests while the CRD was gone, resume after it came back.
    total = rep.metric(CR_RESTARTS) - restarts_at_gone
    ext = client.ApiextensionsV1Api(env.api_client)
    crd_created = ext.read_custom_resource_definition(names.CRD_NAME).metadata.creation_timestamp
    back = next(line for line in rep.log().splitlines() if BACK_LINE in line)
    back_at = datetime.strptime(back[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()
    print(
        f"CRD deleted: {total:.0f} list/watch attempts of the CR in "
        f"{time.monotonic() - gone_at:.0f} s; the reporter saw the CRD again "
        f"{(back_at - crd_created).total_seconds():.1f} s after its creationTimestamp"
    )

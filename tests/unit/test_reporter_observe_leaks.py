"""Caches that must not outlive what they describe, or decide after they stopped being true.

Issue 16: after a 403 mid-run the pod cache kept deciding the phase; an informer stopped
while it re-listed restored its cache (a deleted CR's Secret watch kept ``tls.key``) and opened
a new watch; a reconcile racing a CR deletion re-created the deleted CR's informers; an object
that lost its labels was "missing". Each case drives the real Informer/Observer with fakes.
"""

from __future__ import annotations

import threading

from kubernetes.client.exceptions import ApiException
from test_reporter_observe import INSTANCE, FakeApi, NoStartInformer, by_kind, cr, make, obj

from pmem_components import names as n
from reporter.metrics import Metrics
from reporter.model import expected_objects
from reporter.observe import POD, Informer, Observer
from reporter.write import build_observed


def test_a_403_after_sync_empties_the_cache_and_marks_its_crs_dirty():
    stop = threading.Event()
    api = FakeApi(
        lists=[([obj("p1", "5", labels=INSTANCE)], "10")],
        watches=[ApiException(status=403, reason="Forbidden")],
    )
    changes: list = []
    inf = Informer(
        api,
        POD,
        lambda i, t, o, b: changes.append((t, ((o or b or {}).get("metadata") or {}).get("name"))),
        Metrics(),
        namespace="pmem-csi",
    )

    def wait(_t: float) -> bool:
        stop.set()
        return True

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    assert inf.error == "403 Forbidden"
    assert inf.items() == []  # a stale copy must not decide anything
    assert ("DELETED", "p1") not in changes  # unknown, not gone
    assert changes[-1] == ("UNREADABLE", None)  # the CRs are recomputed now, not at resync


def test_an_informer_stopped_while_it_relists_keeps_nothing_and_opens_no_watch():
    holder: list = []

    class Api(FakeApi):
        def list(self, *a, **kw):
            holder[0].stop()  # the CR was deleted while the list was on its way
            return super().list(*a, **kw)

    api = Api(lists=[([obj("registry-secrets", "5")], "10")], watches=[[]])
    inf = make(api, [])
    holder.append(inf)
    inf.run()
    assert len(inf) == 0
    assert [c[0] for c in api.calls] == ["list"]  # no watch after the stop
    assert not inf.synced


def test_a_reconcile_racing_the_crs_deletion_does_not_recreate_its_informers():
    observer = Observer(
        FakeApi([], []), Metrics(), deployments=["a"], informer_factory=NoStartInformer
    )
    observer.start()
    crs = observer.cr_informers[0]
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    stale = observer.cr("a")  # what the writer read before the deletion
    crs._handle({"type": "DELETED", "object": cr("a", "2", ns="drv")})
    assert observer.all_informers() == observer.cr_informers
    observer.ensure_for(stale)  # the writer's "not settled yet" path, a moment late
    assert observer.all_informers() == observer.cr_informers


class LookupApi(FakeApi):
    def __init__(self, found: dict) -> None:
        super().__init__([], [])
        self.found = found
        self.gets: list = []

    def get_metadata(self, res, name, namespace=None):
        self.gets.append((res.kind, name, namespace))
        return self.found.get((res.kind, name))


def test_an_object_gone_from_the_label_selected_cache_is_looked_up_by_name_and_relabelled():
    names = n.DeploymentNames("a")
    ds = {
        "kind": "DaemonSet",
        "metadata": {
            "name": names.node_driver,
            "namespace": "drv",
            "resourceVersion": "9",
            "labels": {n.LABEL_PART_OF: n.PART_OF, "team": "x"},  # instance label removed
        },
    }
    api = LookupApi({("DaemonSet", names.node_driver): ds})
    observer = Observer(api, Metrics(), deployments=["a"], informer_factory=NoStartInformer)
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    seen = build_observed(observer, observer.cr("a"))
    assert seen.relabelled == {("DaemonSet", names.node_driver): {n.LABEL_PART_OF: n.PART_OF}}
    # Asked once per object, not on every reconcile while it stays away.
    build_observed(observer, observer.cr("a"))
    assert api.gets.count(("DaemonSet", names.node_driver, "drv")) == 1
    # Kinds watched by name (Secrets, cluster-scoped objects) are not looked up: their
    # watches do not depend on labels.
    assert {kind for kind, _, _ in api.gets} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "StatefulSet",
        "DaemonSet",
    }
    # Back in the cache (labels restored): not relabelled any more.
    (ds_inf,) = [i for i in by_kind(observer, "DaemonSet")]
    ds_inf._handle(
        {
            "type": "ADDED",
            "object": {
                **ds,
                "metadata": {
                    **ds["metadata"],
                    "resourceVersion": "10",
                    "labels": {n.LABEL_PART_OF: n.PART_OF, n.LABEL_INSTANCE: names.hyphened},
                },
            },
        }
    )
    assert build_observed(observer, observer.cr("a")).relabelled == {}


class FailingLookupApi(LookupApi):
    def __init__(self, error: BaseException) -> None:
        super().__init__({})
        self.error = error

    def get_metadata(self, res, name, namespace=None):
        self.gets.append((res.kind, name, namespace))
        raise self.error


def test_a_failed_lookup_of_an_absent_object_is_unknown_not_missing():
    """Review of issue 16: a GET that fails (403/500/timeout) says nothing about the object;
    it was reported "missing" (DriverDeployed=False, phase Failed)."""
    from reporter import status as st

    for error in (
        ApiException(status=403, reason="Forbidden"),
        ApiException(status=500, reason="Internal Server Error"),
        TimeoutError("read timed out"),
    ):
        api = FailingLookupApi(error)
        observer = Observer(api, Metrics(), deployments=["a"], informer_factory=NoStartInformer)
        observer.start()
        observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
        labels = {n.LABEL_PART_OF: n.PART_OF, n.LABEL_INSTANCE: n.DeploymentNames("a").hyphened}
        for exp in expected_objects(n.DeploymentNames("a")):
            if exp.kind == "DaemonSet":
                continue  # absent from its cache: relabelled or deleted?
            (inf, *_) = by_kind(observer, exp.kind)
            where = "drv" if exp.namespaced else ""
            inf._handle({"type": "ADDED", "object": obj(exp.name, "3", ns=where, labels=labels)})
        seen = build_observed(observer, observer.cr("a"))
        assert "DaemonSet" in seen.unreadable, error
        assert "could not be looked up" in seen.unreadable["DaemonSet"]
        from datetime import UTC, datetime

        out = st.compute_status(seen, datetime(2026, 1, 1, tzinfo=UTC))
        deployed = next(c for c in out["conditions"] if c["type"] == st.DRIVER_DEPLOYED)
        assert deployed["status"] == st.UNKNOWN, deployed
        assert "missing" not in deployed["message"].lower(), deployed
        assert deployed["reason"] == "ObjectsUnreadable"
        # A failure is asked again soon, not believed for a minute; a 404 is still missing.
        assert api.gets.count(("DaemonSet", n.DeploymentNames("a").node_driver, "drv")) == 1


class _FlakyLookupApi(LookupApi):
    """The first GET of the node DaemonSet fails (500), later ones find it relabelled."""

    def __init__(self, found: dict) -> None:
        super().__init__(found)
        self.failed = False

    def get_metadata(self, res, name, namespace=None):
        if not self.failed and res.kind == "DaemonSet":
            self.failed = True
            self.gets.append((res.kind, name, namespace))
            raise ApiException(status=500, reason="Internal Server Error")
        return super().get_metadata(res, name, namespace)


class _StatusApi:
    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.patches: list[dict] = []

    def get_cr(self, name):
        return self.observer.cr(name)

    def patch_status(self, name, patch):
        self.patches.append(patch)
        current = self.observer.cr(name) or {}
        status = {**(current.get("status") or {}), **patch["status"]}
        meta = current["metadata"]
        rv = str(int(meta["resourceVersion"]) + 1)
        return {**current, "metadata": {**meta, "resourceVersion": rv}, "status": status}

    def create_event(self, namespace, event):
        return event


def test_a_failed_lookup_is_reconciled_again_when_it_may_be_asked_again():
    """Review of issue 16: a failed GET made the kind Unknown for ``LOOKUP_RETRY`` (5 s),
    but nothing reconciled the CR after that: Unknown stayed until the next resync (60 s).
    Now the writer asks the main loop to come back once the lookup may be asked again, and
    that reconcile writes the true verdict (relabelled)."""
    from datetime import UTC, datetime

    from reporter import status as st
    from reporter.observe import LOOKUP_RETRY
    from reporter.write import StatusWriter

    names = n.DeploymentNames("a")
    ds = {
        "kind": "DaemonSet",
        "metadata": {
            "name": names.node_driver,
            "namespace": "drv",
            "resourceVersion": "9",
            "labels": {n.LABEL_PART_OF: n.PART_OF},  # instance label removed
        },
    }
    clock = [1000.0]
    api = _FlakyLookupApi({("DaemonSet", names.node_driver): ds})
    observer = Observer(
        api, Metrics(), deployments=["a"], informer_factory=NoStartInformer, clock=lambda: clock[0]
    )
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    labels = {n.LABEL_PART_OF: n.PART_OF, n.LABEL_INSTANCE: names.hyphened}
    for exp in expected_objects(names):
        if exp.kind != "DaemonSet":  # every other object is there
            (inf, *_) = by_kind(observer, exp.kind)
            where = "drv" if exp.namespaced else ""
            inf._handle({"type": "ADDED", "object": obj(exp.name, "3", ns=where, labels=labels)})
    for inf in observer.all_informers():
        inf._synced.set()
    status_api = _StatusApi(observer)
    writer = StatusWriter(
        status_api,
        observer,
        Metrics(),
        is_leader=lambda: True,
        event_namespace="default",
        now=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        monotonic=lambda: clock[0],
    )

    def deployed() -> dict:
        written = status_api.patches[-1]["status"]
        return next(c for c in written["conditions"] if c["type"] == st.DRIVER_DEPLOYED)

    assert writer.reconcile("a")
    assert deployed()["status"] == st.UNKNOWN
    due = writer.deferred.get("a")
    assert due is not None, "nothing brings the CR back before the resync"
    assert clock[0] + LOOKUP_RETRY <= due <= clock[0] + LOOKUP_RETRY + 1.0
    clock[0] = due
    writer.reconcile("a")
    assert deployed()["reason"] == "ObjectsRelabelled", deployed()


def test_a_remembered_failed_lookup_does_not_grow_a_traceback_on_every_reconcile():
    """Found re-reading issue 16's leaks: the remembered LookupFailed was raised again as the
    same object on every reconcile within its 5 s, each raise adding frames to its
    traceback (and keeping each frame's locals, the observed snapshot among them)."""
    import traceback

    from reporter.model import LookupFailed

    api = FailingLookupApi(ApiException(status=500, reason="Internal Server Error"))
    observer = Observer(
        api, Metrics(), deployments=["a"], informer_factory=NoStartInformer, clock=lambda: 5.0
    )
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    ds = n.DeploymentNames("a").node_driver
    depths: list[int] = []
    for _ in range(50):
        try:
            observer.lookup_labels("DaemonSet", ds, "drv")
        except LookupFailed as exc:
            depths.append(len(traceback.extract_tb(exc.__traceback__)))
    assert len(depths) == 50 and len(api.gets) == 1  # remembered, asked once
    assert set(depths[1:]) == {depths[1]}, depths  # not deeper with every raise

"""Informer list/watch bookkeeping and the Observer's change-to-CR mapping, with fake streams."""

from __future__ import annotations

import threading

import pytest
from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.observe import CR, POD, Informer, Observer, label_selector_for


def obj(name: str, rv: str, ns: str = "pmem-csi", labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels or {}}
    }


class FakeApi:
    """Scripted lists and watch sessions; records every call."""

    def __init__(self, lists: list, watches: list) -> None:
        self.lists = list(lists)
        self.watches = list(watches)
        self.calls: list[tuple] = []

    def list(self, res, namespace=None, label_selector=None, field_selector=None):
        self.calls.append(("list", res.plural, namespace, label_selector, field_selector))
        return self.lists.pop(0)

    def watch(
        self,
        res,
        resource_version,
        namespace=None,
        label_selector=None,
        field_selector=None,
        timeout_seconds=300,
    ):
        self.calls.append(("watch", res.plural, resource_version))
        session = self.watches.pop(0)
        if isinstance(session, Exception):
            raise session
        return Stream(session)

    def get(self, res, name, namespace=None):
        return None


class Stream:
    def __init__(self, events: list) -> None:
        self.events = events
        self.closed = False

    def __iter__(self):
        yield from self.events

    def close(self) -> None:
        self.closed = True


def make(api, changes):
    return Informer(
        api,
        POD,
        lambda inf, t, o, b: changes.append((t, (o or b)["metadata"]["name"])),
        Metrics(),
        namespace="pmem-csi",
        label_selector="a=b",
    )


def test_list_then_watch_resumes_from_last_resource_version():
    api = FakeApi(
        lists=[([obj("p1", "5")], "10")],
        watches=[
            [
                {"type": "ADDED", "object": obj("p2", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ],
            [{"type": "MODIFIED", "object": obj("p1", "16")}],
        ],
    )
    changes: list = []
    inf = make(api, changes)
    inf.run_once()
    assert inf.synced
    assert inf.resource_version == "15"  # the bookmark moved it past the last event
    inf.run_once()  # no re-list: the watch resumes
    assert [c[0] for c in api.calls] == ["list", "watch", "watch"]
    assert api.calls[1][2] == "10" and api.calls[2][2] == "15"
    assert changes == [("ADDED", "p1"), ("ADDED", "p2"), ("MODIFIED", "p1")]
    assert inf.get("p1", "pmem-csi")["metadata"]["resourceVersion"] == "16"


def test_gone_error_event_relists_and_reports_deletions_missed_in_between():
    api = FakeApi(
        lists=[
            ([obj("p1", "5"), obj("p2", "6")], "10"),
            ([obj("p2", "20"), obj("p3", "21")], "22"),
        ],
        watches=[[{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}], []],
    )
    changes: list = []
    inf = make(api, changes)
    inf.run_once()
    assert inf.resource_version is None  # forgotten: must re-list
    changes.clear()
    inf.run_once()
    assert sorted(changes) == [("ADDED", "p3"), ("DELETED", "p1"), ("MODIFIED", "p2")]
    assert {o["metadata"]["name"] for o in inf.items()} == {"p2", "p3"}
    assert api.calls[-1] == ("watch", "pods", "22")


def test_gone_http_error_on_watch_start_relists():
    api = FakeApi(lists=[([], "1"), ([], "7")], watches=[ApiException(status=410), []])
    inf = make(api, [])
    inf.run_once()
    inf.run_once()
    assert [c[0] for c in api.calls] == ["list", "watch", "list", "watch"]
    assert inf.metrics.relists.labels(resource="pods")._value.get() == 1


def test_other_error_event_raises_and_keeps_resource_version():
    api = FakeApi(
        lists=[([], "1")], watches=[[{"type": "ERROR", "object": {"code": 500, "reason": "Boom"}}]]
    )
    inf = make(api, [])
    with pytest.raises(ApiException):
        inf.run_once()
    assert inf.resource_version == "1"


def test_run_counts_restarts_and_backs_off():
    stop = threading.Event()
    sessions = [[], ApiException(status=503), []]

    class Api(FakeApi):
        def watch(self, *a, **kw):
            if not self.watches:
                stop.set()
                return Stream([])
            return super().watch(*a, **kw)

    api = Api(lists=[([], "1")], watches=sessions)
    inf = make(api, [])
    inf.backoff.base = 0.001
    inf.run(stop)
    assert inf.restarts >= 3
    assert inf.metrics.watch_restarts.labels(resource="pods")._value.get() == inf.restarts
    assert [c[0] for c in api.calls].count("list") == 1  # errors resume, they do not re-list


def test_label_selectors():
    assert label_selector_for(None) == "app.kubernetes.io/part-of=pmem-csi"
    assert label_selector_for(["b.x", "a"]) == (
        "app.kubernetes.io/part-of=pmem-csi,app.kubernetes.io/instance in (a,b-x)"
    )


class NoStartInformer(Informer):
    def start(self, stop):  # the tests drive informers by hand
        pass


def cr(name: str, rv: str = "1", ns: str = "pmem-csi") -> dict:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"namespace": ns}}


def test_observer_maps_changes_to_crs_including_objects_seen_before_their_cr():
    api = FakeApi(lists=[], watches=[])
    observer = Observer(api, Metrics(), informer_factory=NoStartInformer, clock=lambda: 42.0)
    observer.start()
    assert observer.cr_informers[0].field_selector is None
    pod = obj("node-1", "3", labels={"app.kubernetes.io/instance": "pmem-csi-intel-com"})
    observer.ensure_namespace("pmem-csi")
    pods = observer._namespaces["pmem-csi"].informers["Pod"]
    pods._handle({"type": "ADDED", "object": pod})  # before the CR exists
    assert observer.take_dirty(0) == {}
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("pmem-csi.intel.com")})
    assert observer.take_dirty(0) == {"pmem-csi.intel.com": 42.0}
    assert observer.pods("pmem-csi") == [pod]
    pods._handle({"type": "DELETED", "object": pod})
    assert observer.take_dirty(0) == {"pmem-csi.intel.com": 42.0}
    # Objects of another instance do not disturb this CR.
    pods._handle(
        {"type": "ADDED", "object": obj("x", "4", labels={"app.kubernetes.io/instance": "other"})}
    )
    assert observer.take_dirty(0) == {}


def test_observer_per_name_cr_informers_and_namespace_on_cr_arrival():
    observer = Observer(
        FakeApi([], []), Metrics(), deployments=["a", "b"], informer_factory=NoStartInformer
    )
    assert [i.field_selector for i in observer.cr_informers] == [
        "metadata.name=a",
        "metadata.name=b",
    ]
    assert observer.cr_informers[0].res is CR
    observer.start()
    observer.cr_informers[1]._handle({"type": "ADDED", "object": cr("b", ns="drv")})
    assert "drv" in observer._namespaces
    assert not observer.namespace_synced("drv")
    assert not observer.synced


def test_observer_secret_refresh_marks_dirty_only_on_change():
    secrets = {"pmem-csi-intel-com-registry-secrets": {"metadata": {"resourceVersion": "1"}}}

    class Api(FakeApi):
        def get(self, res, name, namespace=None):
            assert res.plural == "secrets" and namespace == "pmem-csi"
            return secrets.get(name)

    observer = Observer(Api([], []), Metrics(), informer_factory=NoStartInformer, clock=lambda: 1.0)
    the_cr = cr("pmem-csi.intel.com")
    assert observer.refresh_secrets(the_cr)
    assert observer.take_dirty(0) == {"pmem-csi.intel.com": 1.0}
    assert not observer.refresh_secrets(the_cr)
    assert observer.find("Secret", "pmem-csi-intel-com-node-secrets", "pmem-csi") is None
    secrets["pmem-csi-intel-com-node-secrets"] = {"metadata": {"resourceVersion": "2"}}
    assert observer.refresh_secrets(the_cr)


def test_cr_deleted_and_recreated_marks_dirty_each_time():
    observer = Observer(
        FakeApi([], []), Metrics(), informer_factory=NoStartInformer, clock=lambda: 5.0
    )
    inf = observer.cr_informers[0]
    inf._handle({"type": "ADDED", "object": cr("d", "1")})
    inf._handle({"type": "DELETED", "object": cr("d", "2")})
    assert observer.cr("d") is None
    assert observer.take_dirty(0) == {"d": 5.0}
    inf._handle({"type": "ADDED", "object": cr("d", "3")})
    assert observer.cr("d")["metadata"]["resourceVersion"] == "3"
    assert observer.take_dirty(0) == {"d": 5.0}

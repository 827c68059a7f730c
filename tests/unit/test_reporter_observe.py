"""Informer list/watch bookkeeping and the Observer's change-to-CR mapping, with fake streams."""

from __future__ import annotations

import threading

import pytest
from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.observe import CR, POD, Informer, Observer, label_selector_for, obj_rv


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

    def list(self, res, namespace=None, label_selector=None, field_selector=None, transform=None):
        self.calls.append(("list", res.plural, namespace, label_selector, field_selector))
        result = self.lists.pop(0)
        if isinstance(result, Exception):
            raise result
        items, rv = result
        return [transform(i) if transform else i for i in items], rv

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
    def start(self, stop=None):  # the tests drive informers by hand
        pass


def cr(name: str, rv: str = "1", ns: str = "pmem-csi") -> dict:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"namespace": ns}}


INSTANCE = {"app.kubernetes.io/instance": "pmem-csi-intel-com"}


def by_kind(observer: Observer, kind: str) -> list[Informer]:
    return [i for i in observer.all_informers() if i.res.kind == kind]


# ------------------------------------------------------------------------ informer fixes


def test_immediately_closed_watches_back_off_instead_of_a_hot_loop():
    stop = threading.Event()

    class Api(FakeApi):
        def watch(self, *a, **kw):
            if len([c for c in self.calls if c[0] == "watch"]) >= 4:
                stop.set()
            self.calls.append(("watch",))
            return Stream([])  # the server closes at once, every time

    inf = make(Api(lists=[([], "1")], watches=[]), [])
    waits: list[float] = []
    inf._stop.wait = lambda t: waits.append(t) or False  # type: ignore[method-assign]
    inf.run(stop)
    assert len(waits) >= 3 and all(w > 0 for w in waits)
    assert waits[2] > waits[0]  # exponential, not constant


def test_forbidden_list_is_not_synced_and_records_the_error():
    stop = threading.Event()
    api = FakeApi(lists=[ApiException(status=403, reason="Forbidden"), ([], "5")], watches=[])
    seen: list = []
    inf = Informer(api, POD, lambda i, t, o, b: seen.append(t), Metrics(), namespace="ns")

    def after_first_wait(_t: float) -> bool:
        assert not inf.synced
        assert inf.settled and inf.error == "403 Forbidden"
        stop.set()
        return True

    inf._stop.wait = after_first_wait  # type: ignore[method-assign]
    inf.run(stop)
    assert seen == ["SETTLED"]  # CRs depending on it get computed (as "unreadable")
    inf.relist()  # permission granted later
    assert inf.synced and inf.error is None


def test_forbidden_watch_after_sync_clears_synced():
    stop = threading.Event()
    api = FakeApi(lists=[([], "1")], watches=[ApiException(status=401, reason="Unauthorized")])
    inf = make(api, [])

    def wait(_t: float) -> bool:
        stop.set()
        return True

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    assert not inf.synced and inf.error == "401 Unauthorized"
    assert inf.resource_version is None  # the next round re-lists


def test_too_large_resource_version_relists_instead_of_retrying_forever():
    too_large = ApiException(status=504, reason="Timeout")
    too_large.body = (
        b'{"kind":"Status","message":"Too large resource version: 20, current: 10",'
        b'"details":{"causes":[{"reason":"ResourceVersionTooLarge"}]},"code":504}'
    )
    event = {
        "type": "ERROR",
        "object": {
            "code": 504,
            "message": "Too large resource version",
            "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]},
        },
    }
    api = FakeApi(lists=[([], "20"), ([], "30"), ([], "40")], watches=[too_large, [event], []])
    inf = make(api, [])
    inf.run_once()
    assert inf.resource_version is None
    inf.run_once()
    assert inf.resource_version is None
    inf.run_once()
    assert [c[0] for c in api.calls] == ["list", "watch", "list", "watch", "list", "watch"]


def test_own_write_neither_rolls_the_cache_back_nor_triggers_a_change():
    changes: list = []
    api = FakeApi(lists=[([cr("d", "10")], "10")], watches=[])
    inf = Informer(api, CR, lambda i, t, o, b: changes.append((t, obj_rv(o))), Metrics())
    inf.relist()
    changes.clear()
    written = {**cr("d", "12"), "status": {"phase": "Running"}}
    inf.put(written)  # the PATCH's answer
    # The watch then delivers an older change and the event of our own write.
    inf._handle({"type": "MODIFIED", "object": cr("d", "11")})
    inf._handle({"type": "MODIFIED", "object": written})
    assert inf.get("d")["metadata"]["resourceVersion"] == "12"
    assert inf.get("d")["status"] == {"phase": "Running"}
    assert changes == []
    inf._handle({"type": "MODIFIED", "object": cr("d", "13")})  # a real change
    assert changes == [("MODIFIED", "13")]


def test_pods_are_cached_trimmed():
    full = obj("p", "3", labels={**INSTANCE, "other": "x"})
    full["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:x": {}}}]
    full["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "uid": "u"}]
    full["spec"] = {"nodeName": "n1", "containers": [{"name": "c", "env": [{"name": "A"}]}]}
    full["status"] = {"phase": "Running", "podIP": "10.0.0.1", "conditions": []}
    inf = make(FakeApi(lists=[([full], "5")], watches=[]), [])
    inf.relist()
    cached = inf.get("p", "pmem-csi")
    assert "managedFields" not in cached["metadata"]
    assert cached["metadata"]["labels"] == INSTANCE
    assert cached["metadata"]["ownerReferences"] == [{"kind": "DaemonSet", "name": "ds"}]
    assert cached["spec"] == {"nodeName": "n1"}
    assert "podIP" not in cached["status"]


# ------------------------------------------------------------------------ observer


def test_observer_maps_changes_to_crs_including_objects_seen_before_their_cr():
    observer = Observer(
        FakeApi([], []), Metrics(), informer_factory=NoStartInformer, clock=lambda: 42.0
    )
    observer.start()
    assert observer.cr_informers[0].field_selector is None
    (pods,) = by_kind(observer, "Pod")
    pod = obj("node-1", "3", labels=INSTANCE)
    pods._handle({"type": "ADDED", "object": pod})  # before the CR exists
    assert observer.take_dirty(0) == {}
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("pmem-csi.intel.com")})
    assert observer.take_dirty(0) == {"pmem-csi.intel.com": 42.0}
    assert [p["metadata"]["name"] for p in observer.pods("pmem-csi")] == ["node-1"]
    assert observer.pods("elsewhere") == []
    pods._handle({"type": "DELETED", "object": pod})
    assert observer.take_dirty(0) == {"pmem-csi.intel.com": 42.0}
    # Objects of another instance do not disturb this CR.
    pods._handle(
        {"type": "ADDED", "object": obj("x", "4", labels={"app.kubernetes.io/instance": "other"})}
    )
    assert observer.take_dirty(0) == {}


def test_every_cr_layout_has_a_constant_number_of_watches():
    observer = Observer(FakeApi([], []), Metrics(), informer_factory=NoStartInformer)
    before = len(observer.all_informers())
    for i in range(100):
        observer.cr_informers[0]._handle({"type": "ADDED", "object": cr(f"d{i}", ns=f"ns{i}")})
    assert len(observer.all_informers()) == before
    assert all(i.namespace is None for i in observer.all_informers())


def test_named_layout_watches_secrets_and_cluster_objects_by_name():
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
    secrets = by_kind(observer, "Secret")
    assert sorted(i.field_selector for i in secrets) == [
        "metadata.name=b-node-secrets",
        "metadata.name=b-registry-secrets",
    ]
    assert {i.namespace for i in secrets} == {"drv"}
    for kind in ("ClusterRole", "ClusterRoleBinding", "CSIDriver"):
        (inf,) = by_kind(observer, kind)
        assert inf.field_selector and inf.field_selector.startswith("metadata.name=")
        assert inf.label_selector is None
    assert not observer.cr_settled(observer.cr("b"))
    assert not observer.synced


def test_informers_of_a_deleted_cr_are_stopped_and_their_caches_dropped():
    observer = Observer(
        FakeApi([], []), Metrics(), deployments=["a"], informer_factory=NoStartInformer
    )
    observer.start()
    crs = observer.cr_informers[0]
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    grouped = [i for i in observer.all_informers() if i not in observer.cr_informers]
    assert grouped
    (secret_inf, _) = by_kind(observer, "Secret")
    secret_inf._handle(
        {
            "type": "ADDED",
            "object": {
                "metadata": {"name": "a-node-secrets", "namespace": "drv", "resourceVersion": "2"},
                "data": {"tls.key": "S0VZ"},
            },
        }
    )
    crs._handle({"type": "DELETED", "object": cr("a", "3", ns="drv")})
    assert observer.all_informers() == observer.cr_informers
    assert all(i._stop.is_set() for i in grouped)
    assert len(secret_inf) == 0  # no key material kept for a deleted deployment


def test_a_cr_moving_namespace_stops_the_old_namespace():
    observer = Observer(
        FakeApi([], []), Metrics(), deployments=["a"], informer_factory=NoStartInformer
    )
    observer.start()
    crs = observer.cr_informers[0]
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="one")})
    old = [i for i in observer.all_informers() if i.namespace == "one"]
    crs._handle({"type": "MODIFIED", "object": cr("a", "2", ns="two")})
    assert all(i._stop.is_set() for i in old)
    assert {i.namespace for i in observer.all_informers() if i.res.namespaced} == {"two"}


def test_settled_informers_mark_their_crs_and_report_unreadable_kinds():
    observer = Observer(
        FakeApi([], []),
        Metrics(),
        deployments=["a"],
        informer_factory=NoStartInformer,
        clock=lambda: 7.0,
    )
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", ns="drv")})
    observer.take_dirty(0)
    the_cr = observer.cr("a")
    for inf in observer.all_informers():
        if inf.res.kind == "Secret":
            inf.error = "403 Forbidden"
            inf._settle()
        elif inf not in observer.cr_informers:
            inf._synced.set()
            inf._settle()
    assert observer.take_dirty(0) == {"a": 7.0}
    assert observer.cr_settled(the_cr)
    assert observer.unreadable_for(the_cr) == {"Secret": "403 Forbidden"}

"""One reporter per stack (issue 16): pods, watches and Lease requests constant in deployments.

The program registers one reporter for every deployment that enables it (unit-tested with
Pulumi's mocks here; ``tests/e2e/test_reporter_stack.py`` runs it with the real engine), and
that reporter's shared layout needs a constant number of watches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pulumi
import pytest
from kubernetes.client.exceptions import ApiException
from pulumi_mocks import project_config
from test_components import Mocks, run, settle, stack
from test_reporter_observe import FakeApi, NoStartInformer, cr

from pmem_components.program import deploy, reporter_problems
from reporter.kubeapi import CONNECTION_POOL_SIZE
from reporter.metrics import Metrics
from reporter.observe import Observer, most_watches

IMAGE = "registry.example/pmem-csi-reporter:1"


@pytest.fixture
def mocks() -> Iterator[Mocks]:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="pmem-csi-pulumi", stack="unit", preview=False)
    with project_config():
        yield m


def dep(name: str, namespace: str, **reporter: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "reporter": {"image": IMAGE, **reporter}}


def watches(n_deployments: int, namespaces: int = 1) -> int:
    names = [f"d{i}.example.org" for i in range(n_deployments)]
    observer = Observer(
        FakeApi([], []),
        Metrics(),
        deployments=names,
        informer_factory=NoStartInformer,
        shared_watches=True,
    )
    observer.start()
    for i, name in enumerate(names):
        observer.cr_informers[0]._handle(
            {"type": "ADDED", "object": cr(name, str(i + 1), ns=f"drv{i % namespaces}")}
        )
    return len(observer.all_informers())


@pytest.mark.parametrize("n", [1, 10, 100])
def test_watches_do_not_grow_with_deployments(n: int) -> None:
    """Review of issue 16: each deployment added two Secret watches (by name). Now: the CRs
    and 3 cluster-scoped kinds cluster-wide, and in each driver namespace one watch per
    namespaced kind (8, Secrets included) by label, whatever the number of deployments
    there. Namespaced kinds are watched per namespace because the reporter's RBAC grants
    them only there (Roles, not a ClusterRole)."""
    assert watches(n) == 1 + 3 + 8
    assert watches(n, namespaces=2) == 1 + 3 + 8 * min(n, 2)
    assert watches(n, namespaces=n) == 1 + 3 + 8 * n  # grows with namespaces, only


def test_a_cr_the_reporter_does_not_serve_is_ignored_and_its_namespace_not_watched() -> None:
    observer = Observer(
        FakeApi([], []),
        Metrics(),
        deployments=["a"],
        informer_factory=NoStartInformer,
        shared_watches=True,
    )
    observer.start()
    before = len(observer.all_informers())
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("stranger", "1", ns="x")})
    assert observer.crs() == [] and observer.cr("stranger") is None
    assert len(observer.all_informers()) == before
    assert observer.take_dirty(0) == {}


def test_the_watches_of_a_namespace_stop_with_its_last_cr() -> None:
    observer = Observer(
        FakeApi([], []),
        Metrics(),
        deployments=["a", "b"],
        informer_factory=NoStartInformer,
        shared_watches=True,
    )
    observer.start()
    crs = observer.cr_informers[0]
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="one")})
    crs._handle({"type": "ADDED", "object": cr("b", "2", ns="one")})
    secrets = [i for i in observer.all_informers() if i.res.kind == "Secret"]
    assert len(secrets) == 1 and secrets[0].namespace == "one" and secrets[0].label_selector
    assert secrets[0].field_selector is None  # by label: one watch for both CRs' Secrets
    crs._handle({"type": "DELETED", "object": cr("a", "3", ns="one")})
    assert not secrets[0]._stop.is_set()  # b still lives there
    crs._handle({"type": "DELETED", "object": cr("b", "4", ns="one")})
    assert secrets[0]._stop.is_set()
    assert [i for i in observer.all_informers() if i.res.namespaced] == []


def test_reporter_settings_that_disagree_are_refused_naming_the_keys() -> None:
    s = stack(dep("a.example.org", "one"), dep("b.example.org", "two", replicas=3))
    (problem,) = reporter_problems(s)
    assert problem.startswith("pmem-csi:deployments[1].reporter.replicas: is 3")
    assert "pmem-csi:deployments[0].reporter.replicas is 2" in problem
    # Deployments without the reporter do not count.
    assert reporter_problems(stack(dep("a.example.org", "one"), {"name": "b.example.org"})) == []


def test_the_program_registers_one_reporter_for_all_deployments(mocks) -> None:
    run(lambda: _one_reporter(mocks))


def _one_reporter(mocks) -> Any:
    outputs = deploy(
        stack(dep("a.example.org", "one"), dep("b.example.org", "two"), dep("c.example.org", "two"))
    )

    def check(out: Any) -> None:
        deployments = [r for r in mocks.resources if r.typ == "kubernetes:apps/v1:Deployment"]
        (reporter,) = deployments
        assert reporter.inputs["metadata"]["name"] == "a-example-org-reporter"
        assert reporter.inputs["metadata"]["namespace"] == "one"
        assert reporter.inputs["spec"]["replicas"] == 2
        args = reporter.inputs["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [args[i + 1] for i, a in enumerate(args) if a == "--deployment"] == [
            "a.example.org",
            "b.example.org",
            "c.example.org",
        ]
        assert "--shared-watches" in args
        roles = [
            r for r in mocks.resources if r.typ == "kubernetes:rbac.authorization.k8s.io/v1:Role"
        ]
        reporter_roles = {
            r.inputs["metadata"]["namespace"]
            for r in roles
            if r.inputs["metadata"]["name"].startswith("a-example-org-reporter")
        }
        assert reporter_roles == {"one", "two", "default"}
        for name in ("a.example.org", "b.example.org", "c.example.org"):
            assert out[name]["objectNames"]["reporter"] == "a-example-org-reporter"

    return settle(outputs, check)


def test_the_reporter_deployment_waits_for_its_rbac() -> None:
    """Review of issue 16: the reporter's Deployment (moved to serve every deployment) rolled
    out in parallel with the RBAC that grants it the new deployments' namespaces: its new
    pods met 403s and wrote "could not be read" until the Roles existed."""
    from types import SimpleNamespace

    from pmem_components.program import register_reporter

    s = stack(dep("a.example.org", "one"), dep("b.example.org", "two"))
    registered: list[tuple[str, str, list[Any]]] = []

    def register(obj: dict[str, Any], deps: Any) -> Any:
        handle = SimpleNamespace(kind=obj["kind"], name=obj["metadata"]["name"])
        registered.append((obj["kind"], obj["metadata"].get("namespace", ""), list(deps)))
        return handle

    components = [
        SimpleNamespace(deployment_cr=f"cr-{d.name}", register_reporter_object=register)
        for d in s.deployments
    ]
    out = register_reporter(s, components, {})
    rbac = [h for h in out if h.kind != "Deployment"]
    (deployment_deps,) = [deps for kind, _, deps in registered if kind == "Deployment"]
    assert {h.kind for h in rbac} >= {"ServiceAccount", "ClusterRole", "Role", "RoleBinding"}
    for handle in rbac:
        assert handle in deployment_deps, handle
    assert all(cr in deployment_deps for cr in ("cr-a.example.org", "cr-b.example.org"))


class _CountingInformer(NoStartInformer):
    """Counts the informers the Observer starts (each is one watch), and stops."""

    started: list  # set per test

    def start(self, stop=None):
        type(self).started.append(self)

    def stop(self):
        super().stop()
        type(self).started.remove(self)


def started_watches(namespaces: int, per_namespace: int = 3) -> int:
    """Watches open in the stack layout with ``per_namespace`` deployments in each of
    ``namespaces`` driver namespaces: the informers the Observer started and not stopped."""
    _CountingInformer.started = []
    names = [f"d{i}.example.org" for i in range(namespaces * per_namespace)]
    observer = Observer(
        FakeApi([], []),
        Metrics(),
        deployments=names,
        informer_factory=_CountingInformer,
        shared_watches=True,
    )
    observer.start()
    for i, name in enumerate(names):
        observer.cr_informers[0]._handle(
            {"type": "ADDED", "object": cr(name, str(i + 1), ns=f"drv{i % namespaces}")}
        )
    return len(_CountingInformer.started)


def test_the_documented_watch_figure_is_the_number_of_watches_the_reporter_opens() -> None:
    """Review of issue 16: the docs give the stack reporter's watches as a figure ("4, plus 8
    per driver namespace"); here it is read from the docs and compared with the informers
    the code starts for 1, 2, 10 and 100 driver namespaces (3 deployments in each)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = " ".join((root / "docs" / "reporter.md").read_text().split())
    found = re.findall(
        r"watches(?: per reporter pod)?: (\d+), plus (\d+) per driver namespace", text
    )
    assert found, "docs/reporter.md no longer states the watch figure"
    for fixed, per_namespace in found:
        for ns in (1, 2, 10, 100):
            assert started_watches(ns) == int(fixed) + int(per_namespace) * ns, (ns, fixed)
    # The module docstrings say the same.
    from pmem_components.manifests import reporter as manifest
    from reporter import observe

    for doc in (observe.__doc__, manifest.__doc__):
        figure = re.search(
            r"[Ww]atches: (\d+),? plus (\d+) per driver namespace", " ".join((doc or "").split())
        )
        assert figure and figure.groups() == found[0], figure


class _GrantLaterApi(FakeApi):
    """Namespace ``two``'s Role is created a moment after the CR moved there: its lists are
    refused (403) ``refusals`` times, then served."""

    def __init__(self, refusals: int) -> None:
        super().__init__([], [])
        self.refusals = refusals

    def list(self, res, namespace=None, label_selector=None, field_selector=None, transform=None):
        if namespace == "two" and self.refusals:
            self.refusals -= 1
            raise ApiException(status=403, reason="Forbidden")
        return [], "5"

    def watch(self, *args, **kwargs):
        raise ConnectionError("the test ends the watch here")


def _moved_observer(api: FakeApi) -> tuple[Observer, list]:
    observer = Observer(
        api, Metrics(), deployments=["a"], informer_factory=NoStartInformer, shared_watches=True
    )
    observer.start()
    crs = observer.cr_informers[0]
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="one")})  # the first list
    crs._synced.set()
    crs._handle({"type": "MODIFIED", "object": cr("a", "2", ns="two")})  # the move
    moved = [i for i in observer.all_informers() if i.namespace == "two"]
    assert len(moved) == 8
    return observer, moved


def _run_until(inf, observer: Observer, now: list, waits: int, step: float = 0.0) -> list:
    """Run one informer's loop by hand; at each of its waits note what the writer would see."""
    stop = threading.Event()
    seen: list = []

    def wait(seconds: float) -> bool:
        a = observer.cr("a")
        seen.append((seconds, inf.error, observer.cr_settled(a), observer.unreadable_for(a)))
        now[0] += max(seconds, step)
        if len(seen) >= waits:
            stop.set()
        return False

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.clock = lambda: now[0]
    inf.run(stop)
    return seen


def test_a_403_just_after_a_namespace_move_is_retried_not_reported() -> None:
    """Review of issue 16 (d): the program creates the reporter's Role in a driver
    namespace after the CR's update (the Role depends on the CR), so for a few seconds
    after a deployment moves to a new namespace the reporter's new watches there meet 403.
    That was reported at once (``SecretsUnreadable``, ``... could not be read: 403``) as if
    permissions were missing. Now a new namespace's watches retry a 401/403 every second for
    ``NEW_GRANT_SECONDS`` without reporting it: the CR waits (not settled, so nothing is
    written for its new generation) and gets its true status once the Role is there."""
    observer, moved = _moved_observer(_GrantLaterApi(refusals=3))
    secrets = next(i for i in moved if i.res.kind == "Secret")
    now = [100.0]
    seen = _run_until(secrets, observer, now, waits=4)
    for delay, error, _settled, unreadable in seen[:3]:  # the three 403s
        assert error is None and "Secret" not in unreadable, seen
        assert delay <= 1.0, seen
    from reporter.observe import NEW_GRANT_SECONDS

    assert now[0] - 100.0 < NEW_GRANT_SECONDS
    assert secrets.synced  # listed once the Role was there


def test_a_403_that_lasts_after_a_namespace_move_is_reported() -> None:
    observer, moved = _moved_observer(_GrantLaterApi(refusals=1000))
    secrets = next(i for i in moved if i.res.kind == "Secret")
    now = [100.0]
    seen = _run_until(secrets, observer, now, waits=40, step=1.0)  # 40 s and more of 403
    assert seen[0][1] is None  # at first: retried
    _delay, error, _settled, unreadable = seen[-1]
    assert error == "403 Forbidden" and unreadable["Secret"] == "403 Forbidden"
    assert secrets.settled  # its CR is computed (with Secrets unreadable), not held back


def test_a_403_in_a_namespace_of_the_first_list_is_reported_at_once() -> None:
    """At the start the grants exist already (the reporter Deployment depends on them): a
    403 then is what it says, reported at once as before."""
    api = _GrantLaterApi(refusals=1000)
    observer = Observer(
        api, Metrics(), deployments=["a"], informer_factory=NoStartInformer, shared_watches=True
    )
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="two")})
    secrets = next(i for i in observer.all_informers() if i.res.kind == "Secret")
    seen = _run_until(secrets, observer, [100.0], waits=1)
    assert seen[0][1] == "403 Forbidden" and seen[0][3]["Secret"] == "403 Forbidden"


def test_the_connection_pool_keeps_a_connection_for_every_watch_of_the_stack_reporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Benchmark of issue 16 at 100 deployments in 100 namespaces: 804 watches on a pool of 32
    connections; each ended watch's connection was dropped (a new TLS handshake for the next)
    with a warning, 8,010 in 5 minutes. The reporter sizes the pool for its deployments: room
    for every watch of the stack layout (one namespace per deployment, the most watches) plus
    the Lease, status and Event requests."""
    from reporter import __main__ as main
    from reporter.__main__ import Reporter, parse_args

    pools: list[int] = []

    def fake_client(kubeconfig: str | None, pool_size: int = 0) -> object:
        pools.append(pool_size)
        raise RuntimeError("stop here")

    monkeypatch.setattr(main, "load_api_client", fake_client)
    for count in (1, 10, 100):
        names = [f"d{i}.example.org" for i in range(count)]
        args = parse_args([a for n in names for a in ("--deployment", n)] + ["--shared-watches"])
        with pytest.raises(RuntimeError, match="stop here"):
            Reporter(args)
        assert pools[-1] >= started_watches(count, per_namespace=1) + 3, count


class _Counting(NoStartInformer):
    started: ClassVar[list] = []

    def start(self, stop=None):
        type(self).started.append(self)


def _named_layout_watches(n: int) -> int:
    """Informers the named layout (``--deployment`` without ``--shared-watches``) starts for
    ``n`` CRs, each in its own driver namespace."""
    _Counting.started = []
    names = [f"d{i}.example.org" for i in range(n)]
    observer = Observer(FakeApi([], []), Metrics(), deployments=names, informer_factory=_Counting)
    observer.start()
    for i, inf in enumerate(observer.cr_informers):
        name = inf.field_selector.split("=", 1)[1]
        inf._handle({"type": "ADDED", "object": cr(name, str(i + 1), ns=f"drv{i}")})
    return len(_Counting.started)


@pytest.mark.parametrize("n", [13, 100])
def test_most_watches_bounds_the_named_layout_too(n: int) -> None:
    """most_watches claims an upper bound "in any layout"; the named layout opens 13 per CR
    (its CR by name, 7 per namespace, 2 Secrets and 3 cluster-scoped objects by name)."""
    assert most_watches(n) >= _named_layout_watches(n)


def test_the_pool_holds_every_named_layout_watch_at_100_deployments() -> None:
    """The reporter's pool (CONNECTION_POOL_SIZE + most_watches) for 100 named CRs without
    --shared-watches: 1,244, for 1,300 watches plus the Lease and the reconcile loop."""
    assert CONNECTION_POOL_SIZE + most_watches(100) >= _named_layout_watches(100) + 2

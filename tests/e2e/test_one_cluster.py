"""One cluster, one plan: the program's own requests go where the provider's go, and write only
for what the update changes (issue 14).

* The table of ways to choose a cluster (tests/unit/test_kubetarget.py) run through the
  locally built kubectl: client-go contacts the server the table says, so the program's rules
  (:mod:`pmem_components.kubetarget`) are client-go's.
* A second local cluster beside the first, combined with it in kubeconfigs in each way a user
  can choose a cluster; ``pulumi preview``, ``up``, ``up --refresh`` and ``up --target`` with the
  real CLI, and after each one every object of the cluster *not* chosen keeps its
  resourceVersion -- although that cluster holds the same driver, deployed by another stack,
  with a field someone else changed (what a misdirected take-over would write). The ways
  share one stack: the first runs the whole sequence, the others one take-over ``up`` (the
  test's docstring says why that suffices).
* On one cluster: ``up --target`` and ``preview`` write nothing for the resources they leave
  out; a label someone added (not declared) is not written by a ``pulumi up`` that changes
  nothing; ``kubectl rollout restart`` survives ``pulumi up`` (generation kept) and the
  reporter stays ``Running``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from pmem_components import kubecall, names
from pmem_components.components import COMPONENT_TYPE, NODE_TYPE
from pmem_components.manifests import bundle
from tests.e2e.readme import Shell
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    condition,
    token_kubeconfig,
)
from tests.e2e.test_program import (
    Cluster,
    parsed,
    resource_changes,
    stack_config,
)
from tests.e2e.waiting import wait_for
from tests.unit.test_kubetarget import CASES, Case, materialize
from tools import localenv, toolchain
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)


# --------------------------------------------------------------------------------------------
# the table, through kubectl (client-go)


def _kubectl_server(case: Case, tmp: Path) -> subprocess.CompletedProcess[str]:
    """kubectl choosing a cluster the way ``case`` does, asked for ``/version``."""
    settings, env = materialize(case, tmp)
    args = [str(toolchain.bin_path("kubectl")), "get", "--raw", "/version"]
    args += ["--request-timeout=10s"]
    if settings.kubeconfig is not None:
        path = Path(settings.kubeconfig)
        if not case.setting or not case.setting.startswith("@"):
            path = tmp / "content"  # the provider parses the value; kubectl reads a file
            path.write_text(settings.kubeconfig)
        args += ["--kubeconfig", str(path)]
    if settings.context:
        args += ["--context", settings.context]
    if settings.cluster:
        args += ["--cluster", settings.cluster]
    run_env = {"PATH": os.environ["PATH"], "HOME": env.home}
    if env.kubeconfig is not None:
        run_env["KUBECONFIG"] = env.kubeconfig
    return subprocess.run(args, env=run_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kubectl_contacts_the_server_the_table_names(
    case: Case, tmp_path: Path, local_cluster: Path
) -> None:
    result = _kubectl_server(case, tmp_path)
    assert result.returncode != 0  # nothing listens on port 1
    contacted = re.findall(r"127\.0\.0\.\d+:1\b", result.stderr)
    if case.error:
        assert not contacted, result.stderr
    else:
        assert case.server is not None
        assert contacted and set(contacted) == {case.server.removeprefix("https://")}, result.stderr


# --------------------------------------------------------------------------------------------
# two clusters


SECOND = "second-cluster"


@dataclass
class TwoClusters:
    """The session's cluster ("a") and a second one ("b"), each with its own kubeconfig."""

    kubeconfigs: dict[str, Path]
    clients: dict[str, Any]


def _cluster_cmd(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tools.cluster`` for the second cluster: its own state directory."""
    env = {**os.environ, "PMEM_CSI_STATE_DIR": str(state_dir)}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "tools.cluster", *args],
        cwd=toolchain.PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def two_clusters(local_cluster: Path, pulumi_ready: dict[str, str]) -> Iterator[TwoClusters]:
    state = localenv.state_dir() / SECOND
    started = _cluster_cmd(state, "start", "--nodes", "1", "--plain-nodes", "0")
    assert started.returncode == 0, started.stderr[-4000:]
    second = state / "kubeconfig"
    try:
        yield TwoClusters(
            {"a": local_cluster, "b": second},
            {
                "a": config.new_client_from_config(config_file=str(local_cluster)),
                "b": config.new_client_from_config(config_file=str(second)),
            },
        )
    finally:
        if not os.environ.get("PMEM_CSI_KEEP_CLUSTER"):
            _cluster_cmd(state, "stop")


def named(kubeconfig: Path, name: str) -> dict[str, Any]:
    """A cluster's kubeconfig with its cluster, user and context all called ``name``."""
    doc = yaml.safe_load(kubeconfig.read_text())
    ctx = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == ctx["cluster"])["cluster"]
    user = next(u for u in doc["users"] if u["name"] == ctx["user"])["user"]
    for item, keys in (
        (cluster, ("certificate-authority",)),
        (user, ("client-certificate", "client-key")),
    ):
        for key in keys:
            if item.get(key) and not os.path.isabs(item[key]):
                item[key] = str((kubeconfig.parent / item[key]).resolve())
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def combined(
    two: TwoClusters, current: str, contexts: dict[str, tuple[str, str]] | None = None
) -> dict[str, Any]:
    """Both clusters in one kubeconfig; ``contexts`` adds contexts (name -> cluster, user)."""
    a, b = named(two.kubeconfigs["a"], "a"), named(two.kubeconfigs["b"], "b")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": a["clusters"] + b["clusters"],
        "users": a["users"] + b["users"],
        "contexts": a["contexts"] + b["contexts"],
        "current-context": current,
    }
    for ctx, (cluster, user) in (contexts or {}).items():
        doc["contexts"].append({"name": ctx, "context": {"cluster": cluster, "user": user}})
    return doc


# What the program could ever touch; leases, events and nodes change by themselves.
_WATCHED = (
    ("v1", "namespaces"),
    ("v1", "secrets"),
    ("v1", "serviceaccounts"),
    ("v1", "services"),
    ("v1", "configmaps"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
    ("rbac.authorization.k8s.io/v1", "clusterroles"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    ("apps/v1", "statefulsets"),
    ("apps/v1", "daemonsets"),
    ("apps/v1", "deployments"),
    ("storage.k8s.io/v1", "csidrivers"),
    ("apiextensions.k8s.io/v1", "customresourcedefinitions"),
    (f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}", names.CRD_PLURAL),
)


def versions(api_client: Any) -> dict[str, str]:
    """``apiVersion plural namespace/name`` -> resourceVersion of every watched object."""
    out: dict[str, str] = {}
    for api_version, plural in _WATCHED:
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        resp = kubecall.request(api_client, "GET", f"{base}/{plural}", timeout=30)
        if resp.status == 404:
            continue  # the CRD is not installed there
        assert resp.status == 200, (base, plural, resp.status, resp.body[:300])
        for item in json.loads(resp.body).get("items") or []:
            meta = item["metadata"]
            key = f"{api_version} {plural} {meta.get('namespace', '')}/{meta['name']}"
            out[key] = meta["resourceVersion"]
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    keys = sorted(set(before) | set(after))
    return [
        f"{k}: {before.get(k)} -> {after.get(k)}" for k in keys if before.get(k) != after.get(k)
    ]


def settled(api_client: Any, what: str) -> dict[str, str]:
    """The versions once two reads a second apart agree and every workload has caught up
    with its spec (a rollout still running would change them under the test)."""
    last: list[dict[str, str]] = [{}]

    def steady() -> dict[str, str] | None:
        apps = client.AppsV1Api(api_client)
        for w in (
            *apps.list_daemon_set_for_all_namespaces().items,
            *apps.list_stateful_set_for_all_namespaces().items,
        ):
            if (w.status.observed_generation or 0) < (w.metadata.generation or 0):
                return None
        now = versions(api_client)
        same = now == last[0]
        last[0] = now
        return now if same else None

    return wait_for(steady, 120, f"{what}: objects settled", interval=1.0)


def edit_label(api_client: Any, obj: dict[str, Any], key: str, value: str | None) -> None:
    """A PUT of the live object with one label changed (None: removed), as ``kubectl edit``
    does it."""
    meta = obj["metadata"]
    group_version = obj["apiVersion"]
    kind = obj["kind"]
    from kubernetes.dynamic import DynamicClient

    res = DynamicClient(api_client).resources.get(api_version=group_version, kind=kind)
    live = res.get(name=meta["name"], namespace=meta.get("namespace")).to_dict()
    labels = live["metadata"].setdefault("labels", {})
    if value is None:
        labels.pop(key, None)
    else:
        labels[key] = value
    live["metadata"].pop("managedFields", None)
    res.replace(body=live, namespace=meta.get("namespace"), field_manager="kubectl-edit")


def live(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    found = Cluster(api_client).get(obj)
    assert found is not None, obj["metadata"]
    return found


LABEL = "e2e.example.com/one-cluster"
# The stacks here reuse names one after the other: their namespaces go with them.
NOT_RETAINED = {"pmem-csi:retainNamespaces": False}


def gone(api_client: Any, namespace: str) -> None:
    """Wait until ``namespace`` is deleted (a later stack creates it again)."""

    def absent() -> bool:
        names_now = [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
        return namespace not in names_now

    wait_for(absent, 180, f"namespace {namespace} deleted")


def _deployment(sfx: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"one-{sfx}.pmem-csi.intel.com",
        "namespace": f"one-{sfx}",
        "labels": {LABEL: "declared"},
        **extra,
    }


@dataclass(frozen=True)
class Way:
    """One way of combining the two clusters; the program must choose "a"."""

    id: str
    # (KUBECONFIG, kubernetes:* stack config) built from the clusters' files in a directory
    build: Callable[[TwoClusters, Path], tuple[str, dict[str, str]]]


def _files(two: TwoClusters, tmp: Path) -> tuple[Path, Path]:
    a, b = tmp / "a.yaml", tmp / "b.yaml"
    a.write_text(yaml.safe_dump(named(two.kubeconfigs["a"], "a")))
    b.write_text(yaml.safe_dump(named(two.kubeconfigs["b"], "b")))
    return a, b


def _list(two: TwoClusters, tmp: Path) -> tuple[str, dict[str, str]]:
    a, b = _files(two, tmp)
    return f"{a}:{b}", {}


def _empty_first(two: TwoClusters, tmp: Path) -> tuple[str, dict[str, str]]:
    a, b = _files(two, tmp)
    (tmp / "empty.yaml").write_text("")
    return f"{tmp / 'empty.yaml'}:{a}:{b}", {}


def _content_and_context(two: TwoClusters, tmp: Path) -> tuple[str, dict[str, str]]:
    _, b = _files(two, tmp)
    content = "# both clusters, b current\n" + yaml.safe_dump(combined(two, "b"))
    return str(b), {"kubernetes:kubeconfig": content, "kubernetes:context": "a"}


def _path(two: TwoClusters, tmp: Path) -> tuple[str, dict[str, str]]:
    a, b = _files(two, tmp)
    return str(b), {"kubernetes:kubeconfig": str(a)}


def _cluster(two: TwoClusters, tmp: Path) -> tuple[str, dict[str, str]]:
    """A context pairing b's server with a's user, and kubernetes:cluster naming a."""
    _, b = _files(two, tmp)
    both = tmp / "both.yaml"
    both.write_text(yaml.safe_dump(combined(two, "mixed", {"mixed": ("b", "a")})))
    return str(b), {"kubernetes:kubeconfig": str(both), "kubernetes:cluster": "a"}


WAYS = [
    Way("KUBECONFIG a:b, the first file's current-context", _list),
    Way("KUBECONFIG with an empty file first", _empty_first),
    Way(
        "kubernetes:kubeconfig content with a comment first, kubernetes:context",
        _content_and_context,
    ),
    Way("kubernetes:kubeconfig path over KUBECONFIG", _path),
    Way("kubernetes:cluster", _cluster),
]


@dataclass
class Other:
    """The same driver in cluster "b", deployed by another stack, with a declared field
    someone else changed: what a misdirected take-over would write."""

    raw: dict[str, Any]
    project: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.e2e.readme import project_copy

    return project_copy(tmp_path_factory.mktemp("one-cluster"))


def _cli_env(tmp: Path, kubeconfig: str, backend: Path) -> dict[str, str]:
    env = {**os.environ, **localenv.pulumi_env()}
    env["PULUMI_BACKEND_URL"] = backend.as_uri()
    env["KUBECONFIG"] = kubeconfig
    env["PATH"] = os.pathsep.join([str(toolchain.bin_path("kubectl").parent), env["PATH"]])
    return env


@pytest.fixture(scope="module")
def other(
    two_clusters: TwoClusters, project: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Other]:
    backend = tmp_path_factory.mktemp("backend")
    sfx = uuid.uuid4().hex[:6]
    raw = _deployment(sfx)
    env = _cli_env(project, str(two_clusters.kubeconfigs["b"]), backend)
    shell = Shell(project, env)
    name = f"other-{sfx}"
    shell.run(f"pulumi stack init {name}")
    ps.write_stack_config(project, name, stack_config(raw, manage_crd=True))
    shell.run(f"pulumi up --yes --skip-preview --stack {name}")
    ds = next(o for o in bundle.node_objects(parsed(raw)) if o["kind"] == "DaemonSet")
    edit_label(two_clusters.clients["b"], ds, LABEL, "changed-in-b")
    try:
        yield Other(raw, project, env)
    finally:
        Shell(project, env).run(f"pulumi destroy --yes --skip-preview --stack {name}", check=False)
        Shell(project, env).run(f"pulumi stack rm --yes {name}", check=False)


def _urn(stack: str, types: list[str], name: str) -> str:
    return f"urn:pulumi:{stack}::pmem-csi-pulumi::{'$'.join(types)}::{name}"


@dataclass
class Chosen:
    """The stack the ways share: it must deploy to "a" whichever way it is told, with the
    names of the driver in "b" (so a misdirected preflight meets the other stack's CR there
    and a misdirected take-over finds a field someone else owns to write)."""

    name: str
    b_before: dict[str, str]
    env: dict[str, str]
    deployed: bool = False


@pytest.fixture(scope="class")
def chosen(
    two_clusters: TwoClusters, other: Other, project: Path, crd_in_a: None
) -> Iterator[Chosen]:
    """One stack for every way, each way configuring it in turn: no stack per way, and no
    namespace deletion waited for between ways. Destroyed when the ways are done, cluster "b"
    checked once more after the destroy, and its namespace waited for only then (the
    explicit-provider test after the ways deploys the same names to "a")."""
    stack = f"w{uuid.uuid4().hex[:6]}"
    shell = Shell(project, other.env)
    shell.run(f"pulumi stack init {stack}")
    state = Chosen(stack, settled(two_clusters.clients["b"], "cluster b"), other.env)
    try:
        yield state
    finally:
        shell = Shell(project, state.env)
        shell.run(f"pulumi destroy --yes --skip-preview --stack {stack}", check=False)
        shell.run(f"pulumi stack rm --yes {stack}", check=False)
        gone(two_clusters.clients["a"], parsed(other.raw).namespace)
        after = versions(two_clusters.clients["b"])
        assert not changed(state.b_before, after), "pulumi destroy"


class TestTheWaysOfChoosingACluster:
    """The ways share one stack (the ``chosen`` fixture), in the order of ``WAYS``."""

    @pytest.mark.parametrize("way", WAYS, ids=[w.id for w in WAYS])
    def test_the_cluster_not_chosen_stays_untouched(
        self,
        way: Way,
        two_clusters: TwoClusters,
        other: Other,
        chosen: Chosen,
        project: Path,
        tmp_path: Path,
    ) -> None:
        """The first way runs the whole sequence: ``preview``, ``up`` (creating everything),
        ``up --refresh``, ``up --target``, each followed by the check of "b". The others
        run the cheapest operation that still takes both paths of the program's own
        requests through their way of choosing a cluster: one ``pulumi up`` of the deployed
        stack after a label of the DaemonSet was changed in "a" (by then the first way has
        deployed it; run alone, a way first creates it with an ``up`` of its own, checked
        too). That ``up`` runs the preflight read, which in "b" would meet the other
        stack's CR and refuse, and the take-over write, which in "b" would rewrite the
        DaemonSet whose label someone changed there; the label back to ``declared`` in "a"
        shows the write went there. Which operation runs does not change where the program's
        requests go (one ``kubetarget.resolve`` of the stack's settings, whatever the
        operation); what each operation may write is the first way's and the single-cluster
        tests' part. The ways change ``kubernetes:kubeconfig/context/cluster`` on one stack
        without replacing its provider: every way chooses the same cluster "a", and the
        provider replaces only when the active cluster differs."""
        kubeconfig, settings = way.build(two_clusters, tmp_path)
        env = {**other.env, "KUBECONFIG": kubeconfig}
        chosen.env = env
        shell = Shell(project, env)
        stack = chosen.name
        cfg = parsed(other.raw)
        a = two_clusters.clients["a"]

        # This way's own baseline: a misdirected write of an earlier way fails that way only.
        b_before = settled(two_clusters.clients["b"], "cluster b")

        def untouched(step: str) -> None:
            assert not changed(b_before, versions(two_clusters.clients["b"])), step

        config = {**stack_config(other.raw), **NOT_RETAINED, **settings}
        ps.write_stack_config(project, stack, config)
        objs = bundle.build_deployment_objects(cfg)
        sts = next(o for o in objs.controller if o["kind"] == "StatefulSet")
        ds = next(o for o in objs.node if o["kind"] == "DaemonSet")
        if way is WAYS[0]:
            shell.run(f"pulumi preview --stack {stack}")
            untouched("pulumi preview")
            shell.run(f"pulumi up --yes --skip-preview --stack {stack}")  # previewed above
            chosen.deployed = True
            untouched("pulumi up")
            assert Cluster(a).get(objs.deployment_cr) is not None, "the deployment is in a"
            edit_label(a, sts, LABEL, "changed-in-a")
            edit_label(a, ds, LABEL, "changed-in-a")
            shell.run(f"pulumi up --yes --refresh --skip-preview --stack {stack}")
            untouched("pulumi up --refresh")
            assert live(a, sts)["metadata"]["labels"][LABEL] == "declared"
            edit_label(a, sts, LABEL, "changed-in-a")
            edit_label(a, ds, LABEL, "changed-in-a")
            sts_version = live(a, sts)["metadata"]["resourceVersion"]
            urn = _urn(
                stack,
                [COMPONENT_TYPE, NODE_TYPE, "kubernetes:apps/v1:DaemonSet"],
                f"{cfg.namespace}/{cfg.names.node_driver}",
            )
            shell.run(f"pulumi up --yes --skip-preview --stack {stack} --target '{urn}'")
            untouched("pulumi up --target")
            assert live(a, ds)["metadata"]["labels"][LABEL] == "declared"
            left = live(a, sts)
            assert left["metadata"]["resourceVersion"] == sts_version, "not targeted: not written"
            assert left["metadata"]["labels"][LABEL] == "changed-in-a"
        else:
            if not chosen.deployed:
                shell.run(f"pulumi up --yes --skip-preview --stack {stack}")
                chosen.deployed = True
                untouched("pulumi up (creating)")
                assert Cluster(a).get(objs.deployment_cr) is not None, "the deployment is in a"
            edit_label(a, ds, LABEL, "changed-in-a")
            result = shell.run(f"pulumi up --yes --skip-preview --stack {stack}")
            untouched("pulumi up")
            assert live(a, ds)["metadata"]["labels"][LABEL] == "declared", "taken over in a"
            # The provider kept its cluster too: nothing created, replaced or deleted (a
            # provider replaced by the new settings would replace every object).
            summary = re.findall(
                r"^\s*[-+~]*\s*\d+ (created|replaced|deleted)\b", result.stdout, re.MULTILINE
            )
            assert not summary, result.stdout[-3000:]
        for _, result in shell.log:
            assert "Traceback" not in result.stderr + result.stdout


@pytest.fixture(scope="module")
def crd_in_a(api_client: Any) -> None:
    """The shared CRD in the session's cluster (the stacks here do not manage it)."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    ensure_crd(RawApi(api_client))


# --------------------------------------------------------------------------------------------
# one cluster: writes only for what the update changes


@dataclass
class Single:
    stack: Any
    raw: dict[str, Any]
    cfg: Any
    workdir: Path


@pytest.fixture(scope="module")
def single(
    pulumi_ready: dict[str, str],
    crd_in_a: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Single]:
    from tests.e2e.test_program import dispose, make_stack

    work = tmp_path_factory.mktemp("single")
    raw = _deployment(uuid.uuid4().hex[:6], reporter={"image": REPORTER_IMAGE})
    stack = make_stack(work, {**stack_config(raw), **NOT_RETAINED})
    stack.up(on_output=ps.printer("[single up] "))
    try:
        yield Single(stack, raw, parsed(raw), work)
    finally:
        dispose(stack)


def test_up_target_writes_nothing_for_what_it_leaves_out(single: Single, api_client: Any) -> None:
    """Before: the take-over force-applied every object whose fields someone else owned,
    also those ``--target`` leaves out (transforms run for every resource)."""
    objs = bundle.build_deployment_objects(single.cfg)
    sts = next(o for o in objs.controller if o["kind"] == "StatefulSet")
    ds = next(o for o in objs.node if o["kind"] == "DaemonSet")
    edit_label(api_client, sts, LABEL, "changed")
    edit_label(api_client, ds, LABEL, "changed")
    sts_version = live(api_client, sts)["metadata"]["resourceVersion"]
    ds_version = live(api_client, ds)["metadata"]["resourceVersion"]
    lines: list[str] = []
    single.stack.preview(on_output=lines.append)
    assert live(api_client, sts)["metadata"]["resourceVersion"] == sts_version, "preview"
    assert live(api_client, ds)["metadata"]["resourceVersion"] == ds_version, "preview"
    assert "pulumi up would take over fields of StatefulSet" in "".join(lines)
    urn = _urn(
        single.stack.name,
        [COMPONENT_TYPE, NODE_TYPE, "kubernetes:apps/v1:DaemonSet"],
        f"{single.cfg.namespace}/{single.cfg.names.node_driver}",
    )
    single.stack.up(target=[urn], on_output=ps.printer("[single up --target] "))
    assert live(api_client, ds)["metadata"]["labels"][LABEL] == "declared"
    left = live(api_client, sts)
    assert left["metadata"]["resourceVersion"] == sts_version
    assert left["metadata"]["labels"][LABEL] == "changed"
    single.stack.up(on_output=ps.printer("[single up, all] "))
    assert live(api_client, sts)["metadata"]["labels"][LABEL] == "declared"
    # That the take-over leaves nothing for the next ``up`` to do is the next test's first
    # check: its ``up`` (nothing declared changed) must report every resource the same.


def test_a_label_someone_added_is_not_written_by_an_up_that_changes_nothing(
    single: Single, api_client: Any
) -> None:
    """Not declared, so not drift the stack must correct now; it goes with the object's
    next update. Before: the take-over applied the Service on every ``pulumi up``. Run after
    the ``--target`` test on the shared stack, its ``up`` also shows that a take-over leaves
    nothing for the next ``up`` to change."""
    svc = next(
        o for o in bundle.build_deployment_objects(single.cfg).controller if o["kind"] == "Service"
    )
    edit_label(api_client, svc, "example.com/added", "by-someone")
    version = live(api_client, svc)["metadata"]["resourceVersion"]
    result = single.stack.up(on_output=ps.printer("[single up, added label] "))
    changes = resource_changes(result.summary)
    assert set(changes) == {"same"}, (
        f"{changes}: either the previous test's take-over left something for this up to "
        "change, or the label someone added was taken for drift"
    )
    after = live(api_client, svc)
    assert after["metadata"]["resourceVersion"] == version
    assert after["metadata"]["labels"]["example.com/added"] == "by-someone"
    edit_label(api_client, svc, "example.com/added", None)  # the reporter's test follows


def test_rollout_restart_survives_up_and_is_not_drift(
    single: Single, api_client: Any, local_cluster: Path, kubectl: Callable[..., Any]
) -> None:
    """``kubectl rollout restart`` then ``pulumi up``: the DaemonSet keeps its generation and
    the restart stamp, and the reporter reports ``Running`` throughout (before: the reporter
    said ObjectsModified, phase Failed, and ``up`` removed the stamp, rolling every pod
    again: generation 2 -> 3)."""
    cfg = single.cfg
    kubeconfig = token_kubeconfig(
        api_client, local_cluster, cfg.names.reporter, cfg.namespace, single.workdir / "rk"
    )
    reporter = ReporterProcess(
        kubeconfig, cfg.name, cfg.namespace, "one-cluster", single.workdir / "r.log", 2.0
    )
    custom = client.CustomObjectsApi(api_client)
    apps = client.AppsV1Api(api_client)

    def cr() -> dict[str, Any]:
        return custom.get_cluster_custom_object(
            names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, cfg.name
        )

    def running_since(gen: int) -> Callable[[], dict[str, Any]]:
        def check() -> dict[str, Any]:
            ds = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
            status = cr().get("status") or {}
            deployed = condition(status, "DriverDeployed")
            ok = (
                status.get("phase") == "Running"
                and deployed.get("status") == "True"
                and ds.metadata.generation == gen
                and ds.status.observed_generation == gen
                and ds.status.number_ready == ds.status.desired_number_scheduled
            )
            return status if ok else {}

        return check

    try:
        gen = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
        generation = gen.metadata.generation
        wait_for(running_since(generation), 90, "reporter Running before the restart")
        kubectl("rollout", "restart", "-n", cfg.namespace, f"daemonset/{cfg.names.node_driver}")
        wait_for(running_since(generation + 1), 90, "reporter Running after the restart")
        result = single.stack.up(on_output=ps.printer("[single up after restart] "))
        assert set(resource_changes(result.summary)) == {"same"}
        ds = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
        assert ds.metadata.generation == generation + 1
        stamp = "kubectl.kubernetes.io/restartedAt"
        assert stamp in (ds.spec.template.metadata.annotations or {})
        wait_for(running_since(generation + 1), 90, "reporter Running after pulumi up")
        assert reporter.alive
    finally:
        reporter.stop()
        print(reporter.log()[-5000:])


def test_render_yaml_to_directory_sends_no_request(
    two_clusters: TwoClusters, other: Other, project: Path, tmp_path: Path
) -> None:
    """``kubernetes:renderYamlToDirectory``: manifests in files, no request to any cluster,
    also not to the one ``KUBECONFIG`` names (before: the preflight read it and refused the
    CR of the other stack there, and the take-over would have written its objects)."""
    out = tmp_path / "rendered"
    env = {**other.env, "KUBECONFIG": str(two_clusters.kubeconfigs["b"])}
    shell = Shell(project, env)
    stack = f"r{uuid.uuid4().hex[:6]}"
    b_before = settled(two_clusters.clients["b"], "cluster b")
    shell.run(f"pulumi stack init {stack}")
    config = {**stack_config(other.raw), "kubernetes:renderYamlToDirectory": str(out)}
    ps.write_stack_config(project, stack, config)
    # No destroy after: the stack holds only rendered files, on this module's temporary
    # backend, and no other test uses its name.
    result = shell.run(f"pulumi up --yes --skip-preview --stack {stack}")
    assert "pmem-csi:preflight: skipped" in result.stdout + result.stderr
    assert list(out.rglob("*.yaml")), "the manifests are rendered"
    assert not changed(b_before, versions(two_clusters.clients["b"]))


def test_an_explicit_provider_gets_the_take_over(
    two_clusters: TwoClusters,
    other: Other,
    crd_in_a: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Library use: ``PmemCsiDeployment(..., opts=ResourceOptions(provider=p))`` with ``p`` on
    cluster "a" while the default (``KUBECONFIG``) is "b": the take-over reads and writes "a"
    (before: the default cluster)."""
    a_file, b_file = _files(two_clusters, tmp_path)
    cfg = parsed(other.raw)

    def program() -> None:
        import pulumi
        import pulumi_kubernetes as k8s

        from pmem_components import PmemCsiDeployment
        from pmem_components.components import PmemCsiDeploymentArgs

        provider = k8s.Provider("a", kubeconfig=str(a_file))
        PmemCsiDeployment(
            "lib-a",
            PmemCsiDeploymentArgs(cfg, take_over_fields=True, retain_namespace=False),
            pulumi.ResourceOptions(provider=provider),
        )

    stack = ps.select_stack(f"l{uuid.uuid4().hex[:6]}", program, tmp_path / "lib")
    monkeypatch.setenv("KUBECONFIG", str(b_file))
    stack.workspace.env_vars["KUBECONFIG"] = str(b_file)
    a = two_clusters.clients["a"]
    b_before = settled(two_clusters.clients["b"], "cluster b")
    ds = next(o for o in bundle.node_objects(cfg) if o["kind"] == "DaemonSet")
    try:
        stack.up(on_output=ps.printer("[library up] "))
        assert not changed(b_before, versions(two_clusters.clients["b"])), "up"
        edit_label(a, ds, LABEL, "changed-in-a")
        lines: list[str] = []
        stack.up(on_output=lines.append)
        assert live(a, ds)["metadata"]["labels"][LABEL] == "declared"
        assert "took over fields of DaemonSet" in "".join(lines)
        assert not changed(b_before, versions(two_clusters.clients["b"])), "second up"
    finally:
        try:
            stack.destroy(on_output=ps.printer("[library destroy] "))
        finally:
            stack.workspace.remove_stack(stack.name)
    assert not changed(b_before, versions(two_clusters.clients["b"])), "destroy"


def test_in_cluster_service_account_credentials_without_a_kubeconfig(
    other: Other,
    project: Path,
    api_client: Any,
    local_cluster: Path,
    crd_in_a: None,
    tmp_path: Path,
) -> None:
    """The program run as in a pod (CI, the Pulumi Kubernetes Operator): no kubeconfig, a
    ServiceAccount token and CA where Kubernetes mounts them, ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``. The CLI runs in a mount namespace of its own with a tmpfs on ``/run`` holding
    them (the host's ``/run`` is not touched). Before: the preflight failed with "Invalid
    kube-config file. No configuration found." where the provider used the token."""
    sfx = uuid.uuid4().hex[:6]
    account = f"pulumi-{sfx}"
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account("default", {"metadata": {"name": account}})
    binding = {
        "metadata": {"name": account},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
    }
    rbac.create_cluster_role_binding(binding)
    token = core.create_namespaced_service_account_token(
        account, "default", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = named(local_cluster, "a")
    cluster_info = admin["clusters"][0]["cluster"]
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    shutil.copyfile(cluster_info["certificate-authority"], sa / "ca.crt")
    host, port = cluster_info["server"].removeprefix("https://").rsplit(":", 1)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in other.env.items() if k != "KUBECONFIG"}
    env.update(HOME=str(home), KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
    shell = Shell(project, env)
    mounted = (
        "unshare --mount --propagation private sh -c 'mount -t tmpfs tmpfs /run && "
        "mkdir -p /run/secrets/kubernetes.io/serviceaccount && "
        f"cp {sa}/token {sa}/ca.crt /run/secrets/kubernetes.io/serviceaccount/ && "
        'exec "$@"\' sh '
    )
    raw = _deployment(sfx)
    stack = f"i{sfx}"
    shell.run(f"pulumi stack init {stack}")
    ps.write_stack_config(project, stack, {**stack_config(raw), **NOT_RETAINED})
    try:
        result = shell.run(mounted + f"pulumi up --yes --skip-preview --stack {stack}")
        assert "Invalid kube-config" not in result.stdout + result.stderr
        cr = bundle.build_deployment_objects(parsed(raw)).deployment_cr
        assert Cluster(api_client).get(cr) is not None
    finally:
        shell.run(mounted + f"pulumi destroy --yes --skip-preview --stack {stack}", check=False)
        shell.run(f"pulumi stack rm --yes {stack}", check=False)
        rbac.delete_cluster_role_binding(account)
        core.delete_namespaced_service_account(account, "default")

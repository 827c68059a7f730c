"""The reporter Deployment run by a real kubelet on the local cluster's one real node.

kwok's pods run no process; here the reporter's Deployment, exactly as the builders write it
(the program registers the same dicts) and placed by the product's own ``patches`` setting
(:func:`tools.realnode.reporter_patch`), runs as pods of a real kubelet with containerd and
runc (tools/realnode.py): its probes, projected ServiceAccount token, memory limit as a
cgroup, restarts and Lease hand-over are the kubelet's and the kernel's, not imitations.
Tests whose subject is not a probe's timing shorten that probe's period with the same
setting (:data:`FAST_READINESS`, :data:`FAST_LIVENESS`), to wait less; the tests of the
Deployment as written and of readiness use it unpatched.

The node lives in a network namespace of its own; the tests read pod state from the API
server, the pods' endpoints from inside that namespace (:func:`realnode.node_http_get`), and
processes from the host (containerd's task PIDs).
"""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from pmem_components.manifests import bundle
from pmem_components.manifests import reporter as reporter_manifests
from pmem_components.manifests.crd import load_crd
from pmem_components.patches import PatchEntry
from reporter.kubeapi import RawApi, Resource
from reporter.leader import LEASE
from tests.e2e.reporter_helpers import (
    APPS_DEPLOYMENT,
    AS_PULUMI,
    CR_RESOURCE,
    CRD_RESOURCE,
    Driver,
    condition,
    delete_object,
    deploy_driver,
    driver_config,
    ensure_crd,
)
from tests.e2e.waiting import settled, wait_for
from tools import image as image_tool
from tools import realnode

IN_CI = any(
    os.environ.get(var, "").lower() in {"1", "true", "yes"}
    for var in ("CI", "PMEM_CSI_REQUIRE_CLUSTER")
)
REPORTER_IMAGE = f"{realnode.REPORTER_IMAGE_BASE}:{image_tool.TAG}"
CONDITIONS = ("CertsReady", "CertsVerified", "DriverDeployed")
POD = Resource("Pod", "v1", "pods", True)
SERVICE = Resource("Service", "v1", "services", True)
# Pod start (the image is local) plus the reporter's start, list and first write, on a machine
# whose two cores are shared.
READY_TIMEOUT = 240.0
# The documented bound ("takeover within 15 s", docs/reporter.md, leader election;
# reporter/leader.py: at most about 12 s after the leader's last renewal): a deleted leader's
# pod is given SIGTERM by the kubelet and releases the Lease at once, so the other replica takes
# it at its next try (1 s). Measured from the DELETE; waited for longer, so that a slow
# hand-over fails with its time.
DOCUMENTED_TAKEOVER = 15.0
TAKEOVER_TIMEOUT = 60.0
# Three failed liveness probes, 10 s apart (2 s with FAST_LIVENESS), 3 s timeout each; then
# the kubelet's restart.
LIVENESS_TIMEOUT = 120.0


def _probe_period(probe: str, seconds: int) -> dict[str, Any]:
    """A ``patches`` entry (the product's setting) giving the reporter's ``probe`` a period."""
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "jsonPatch": [{"op": "replace", "value": seconds,
                       "path": f"/spec/template/spec/containers/0/{probe}/periodSeconds"}],
    }  # fmt: skip


# Readiness probed every second instead of every 5 (threshold and timeout as written): a new
# pod is Ready about as soon as the reporter is, for tests that wait for Ready pods but are
# about something else (the Lease, SIGTERM, the token, the teardown, `pulumi up`'s await).
FAST_READINESS = _probe_period("readinessProbe", 1)
# Liveness every 2 s instead of 10, the product's three failures and 3 s timeout kept: the
# kubelet restarting a frozen reporter is what the liveness test shows; the product's period
# is the builder's (tests/unit).
FAST_LIVENESS = _probe_period("livenessProbe", 2)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node(local_cluster: Path, real_node_free: None) -> Iterator[realnode.Record]:
    """The real node, with the reporter image (``make image``) in its containerd."""
    if os.geteuid() != 0:
        _unavailable("the real node needs root (network namespace, cgroups, mounts)")
    built = image_tool.build()
    record = realnode.start(images=[(built.archive, realnode.REPORTER_IMAGE_BASE)])
    try:
        yield record
    finally:
        realnode.stop()


def _deploy_reporter(
    raw: RawApi, driver_certs: Any, made: list[Driver], extra_patches: tuple[dict[str, Any], ...]
) -> tuple[Driver, dict[str, Any]]:
    """A driver (kwok) plus its reporter Deployment (real node), appended to ``made``."""
    suffix = uuid.uuid4().hex[:6]
    cfg = driver_config(f"rn-{suffix}.pmem-csi.intel.com", f"rn-{suffix}", REPORTER_IMAGE)
    drv = deploy_driver(raw, cfg, driver_certs)
    made.append(drv)
    (dep,) = [o for o in bundle.reporter_objects(cfg) if o["kind"] == "Deployment"]
    for i, patch in enumerate((realnode.reporter_patch(), *extra_patches)):
        dep = PatchEntry.from_config(patch, f"patches[{i}]").apply(dep)
    raw.create(APPS_DEPLOYMENT, dep, cfg.namespace, field_manager=AS_PULUMI)
    return drv, dep


def _remove(made: list[Driver]) -> None:
    for drv in made:
        for pod in drv.pods(_selector(drv)):
            _print_pod_log(pod)
        drv.delete()


@pytest.fixture
def deploy(raw: RawApi, crd: None, node: realnode.Record, driver_certs: Any) -> Iterator[Callable]:
    """Factory: a driver (kwok) plus its reporter Deployment (real node); removed after."""
    made: list[Driver] = []

    def make(extra_patches: tuple[dict[str, Any], ...] = ()) -> tuple[Driver, dict[str, Any]]:
        return _deploy_reporter(raw, driver_certs, made, extra_patches)

    yield make
    _remove(made)


@pytest.fixture(scope="module")
def unpatched_reporter(
    raw: RawApi, crd: None, node: realnode.Record, driver_certs: Any
) -> Iterator[tuple[Driver, dict[str, Any], list[dict[str, Any]]]]:
    """One rollout of the Deployment as written, two pods Ready, for the tests that only read it.

    (Those tests change nothing of it: sharing saves a rollout and a removal.)
    """
    made: list[Driver] = []
    try:
        drv, dep = _deploy_reporter(raw, driver_certs, made, ())
        pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
        yield drv, dep, pods
    finally:
        _remove(made)


def _selector(drv: Driver) -> str:
    (dep,) = [o for o in bundle.reporter_objects(drv.cfg) if o["kind"] == "Deployment"]
    return ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())


def _print_pod_log(pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    logs = realnode.pod_log_dir() / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    for log in sorted(logs.rglob("*.log")) if logs.exists() else []:
        print(f"===== {log.relative_to(realnode.pod_log_dir())} =====")
        print(log.read_text(errors="replace")[-8000:])


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return status


def _ready_pods(drv: Driver, count: int) -> list[dict[str, Any]]:
    pods = drv.pods(_selector(drv))
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(running) == count and all(_ready(p) for p in running):
        return running
    raise AssertionError(
        [(p["metadata"]["name"], p["status"].get("phase"), _container(p).get("state"))
         for p in pods]
    )  # fmt: skip


def _all_true(drv: Driver) -> dict[str, Any]:
    status = drv.status()
    conds = {c: condition(status, c).get("status") for c in CONDITIONS}
    if status.get("phase") == "Running" and set(conds.values()) == {"True"}:
        return status
    raise AssertionError(f"phase={status.get('phase')!r} {conds}")


def _holder(raw: RawApi, drv: Driver) -> str:
    lease = raw.get(LEASE, drv.names.reporter, drv.namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _pid(pod: dict[str, Any]) -> int:
    return realnode.task_pid(_container(pod)["containerID"])


def _pod_get(pod: dict[str, Any], path: str) -> tuple[int, str]:
    return realnode.node_http_get(pod["status"]["podIP"], 8080, path)


# --------------------------------------------------------------------------- isolation


def test_guard_rules_are_in_place_before_the_first_pod_starts(node: realnode.Record) -> None:
    """The namespace, blackhole routes and nftables drops exist, and existed before containerd.

    containerd creates every pod sandbox, so a guard verified before containerd's process
    started was in place before any pod got an address.
    """
    assert realnode.guard_problems() == []
    assert node.guarded_at_boottime is not None
    containerd_started = realnode.process_start_boottime(node.pids["containerd"])
    # /proc gives the start in clock ticks (truncated): compare at that resolution.
    hz = os.sysconf("SC_CLK_TCK")
    assert math.floor(node.guarded_at_boottime * hz) <= round(containerd_started * hz)
    # The node's processes really are in the namespace (not the host's).
    host_ns = os.readlink("/proc/self/ns/net")
    for name in ("containerd", "kubelet"):
        assert os.readlink(f"/proc/{node.pids[name]}/ns/net") != host_ns, name
    assert os.readlink(f"/proc/{node.pids['kubelet']}/ns/net") == os.readlink(
        f"/proc/{node.pids['containerd']}/ns/net"
    )


def _guard_rules() -> list[tuple[str, list[Any]]]:
    """The rules of the node's nftables table as the kernel has them, counters zeroed."""
    listed = subprocess.run(
        realnode.in_netns("nft", "-j", "list", "table", "inet", realnode.NFT_TABLE),
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rules = []
    for item in json.loads(listed.stdout)["nftables"]:
        if "rule" in item:
            expr = [{"counter": None} if "counter" in e else e for e in item["rule"]["expr"]]
            rules.append((item["rule"]["chain"], expr))
    return rules


def _meta(key: str, value: str) -> dict[str, Any]:
    return {"match": {"op": "==", "left": {"meta": {"key": key}}, "right": value}}


def test_the_guard_is_exactly_the_drop_rules_and_the_routing_policy_is_the_default(
    node: realnode.Record,
) -> None:
    """Read from the kernel, not from guard_problems(): an accept rule added first would show."""
    bridge = realnode.BRIDGE
    assert _guard_rules()[:5] == [
        ("output", [_meta("oif", "lo"), {"accept": None}]),
        ("output", [_meta("oifname", bridge), {"accept": None}]),
        ("output", [{"counter": None}]),
        ("forward", [_meta("iifname", bridge), _meta("oifname", bridge), {"accept": None}]),
        ("forward", [{"counter": None}]),
    ]
    assert [chain for chain, _ in _guard_rules()[5:]] == ["prerouting"]
    rules = subprocess.run(realnode.in_netns("ip", "-j", "rule", "show"), check=True,
                           capture_output=True, text=True).stdout  # fmt: skip
    assert [(r["priority"], r["table"]) for r in json.loads(rules)] == [
        (0, "local"), (32766, "main"), (32767, "default")
    ]


def _udp_probe(netns: str) -> tuple[int | None, int]:
    """sendto 10.255.255.53:53 from a thread inside ``netns``: (errno, OutNoRoutes increase).

    The thread checks that it is in that namespace (never the host's) before it sends.
    """
    import socket
    import threading

    box: dict[str, Any] = {}
    host = os.stat("/proc/thread-self/ns/net").st_ino  # this thread has not moved

    def no_routes() -> int:
        lines = [x.split() for x in Path("/proc/thread-self/net/snmp").read_text().splitlines()
                 if x.startswith("Ip:")]  # fmt: skip
        return int(dict(zip(lines[0], lines[1], strict=True))["OutNoRoutes"])

    def inner() -> None:
        try:
            realnode._setns(netns)
            here = os.stat("/proc/thread-self/ns/net").st_ino
            assert here == os.stat(netns).st_ino != host
            before = no_routes()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    sock.sendto(b"probe", ("10.255.255.53", 53))
                    box["errno"] = None
                except OSError as err:
                    box["errno"] = err.errno
            box["no_routes"] = no_routes() - before
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=inner, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["errno"], box["no_routes"]


def test_a_packet_to_an_outside_address_fails_at_once_in_the_node_and_in_a_pod(
    unpatched_reporter: tuple[Driver, dict[str, Any], list[dict[str, Any]]],
) -> None:
    import errno

    _, _, (pod, _) = unpatched_reporter
    # The node's namespace: the blackhole default route refuses it in routing.
    assert _udp_probe(str(realnode.netns_path())) == (errno.EINVAL, 0)
    # A pod's: no route at all (only the pod range and the Services), counted as such.
    assert _udp_probe(f"/proc/{_pid(pod)}/ns/net") == (errno.ENETUNREACH, 1)


def test_one_real_node_per_machine_a_second_checkout_is_refused(
    node: realnode.Record, tmp_path: Path
) -> None:
    import fcntl
    import sys

    # The lock is held (by the forwarder) for as long as the node lives.
    with open(realnode.LOCK_FILE) as held, pytest.raises(BlockingIOError):
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    other = subprocess.run(
        [sys.executable, "-m", "tools.realnode", "start"],
        cwd=realnode.toolchain.PROJECT_DIR,
        env={**os.environ, "PMEM_CSI_STATE_DIR": str(tmp_path / "other-checkout")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode != 0
    assert f"belongs to {node.state_dir}" in other.stderr, other.stderr[-2000:]
    assert realnode.is_running() and realnode.guard_problems() == []


# --------------------------------------------------------------------------- the reporter


def test_reporter_pods_under_the_kubelet_reach_all_conditions_true(
    unpatched_reporter: tuple[Driver, dict[str, Any], list[dict[str, Any]]], raw: RawApi
) -> None:
    drv, dep, _ = unpatched_reporter
    pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    status = wait_for(lambda: _all_true(drv), READY_TIMEOUT, "all conditions True")
    assert status["phase"] == "Running"
    names = {p["metadata"]["name"] for p in pods}
    assert {p["spec"]["nodeName"] for p in pods} == {realnode.NODE_NAME}
    # The Lease is held by one of the pods (identity <hostname>_<pid>; hostname = pod name).
    holder = wait_for(lambda: _holder(raw, drv), 60, "a Lease holder")
    assert holder.rsplit("_", 1)[0] in names
    # The driver's own pods stay on the kwok nodes.
    others = [p for p in drv.pods() if p["metadata"]["name"] not in names]
    assert others and all(p["spec"]["nodeName"] != realnode.NODE_NAME for p in others)
    pod = pods[0]
    pid = _pid(pod)
    # The image that runs is the one `make image` built (CRI's image ID: its config digest).
    assert _container(pod)["imageID"] == _config_digest(image_tool.build())
    # Served on the pod's address, reached from the node's namespace.
    assert _pod_get(pod, "/healthz")[0] == 200 and _pod_get(pod, "/readyz")[0] == 200
    # The pod's own namespace routes nothing but the pod range and the Services.
    routes = json.loads(
        subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "route", "show"],
            check=True, capture_output=True, text=True,
        ).stdout
    )  # fmt: skip
    assert sorted(r["dst"] for r in routes) == sorted([realnode.POD_CIDR, realnode.SERVICE_CIDR])
    # The memory limit is the container's cgroup's.
    limit = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert limit == reporter_manifests.LIMITS["memory"] == "384Mi"
    assert _memory_limit(pid) == 384 * 2**20
    # The credentials are the projected token of the pod's ServiceAccount, bound to the pod.
    token = Path(f"/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token")
    claims = _jwt_claims(token.read_text())
    assert claims["sub"] == f"system:serviceaccount:{drv.namespace}:{drv.names.reporter}"
    assert claims["kubernetes.io"]["pod"]["name"] == pod["metadata"]["name"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"KUBERNETES_SERVICE_HOST={realnode.KUBERNETES_SERVICE_IP}".encode() in environ
    assert not any(e.startswith(b"KUBECONFIG=") for e in environ)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    # The container's environment reaches the process, glibc's tunables included (read at exec).
    for env in container["env"]:
        assert f"{env['name']}={env['value']}".encode() in environ
    assert "--kubeconfig" not in container["args"]
    # The Deployment's securityContext, as the kernel applies it to the process.
    psc = dep["spec"]["template"]["spec"]["securityContext"]
    proc_status = Path(f"/proc/{pid}/status").read_text()
    assert set(map(int, _proc_field(proc_status, "Uid"))) == {psc["runAsUser"]}
    assert set(map(int, _proc_field(proc_status, "Gid"))) == {psc["runAsGroup"]}
    assert _proc_field(proc_status, "CapBnd") == ["0" * 16]  # capabilities: drop: [ALL]
    assert _proc_field(proc_status, "NoNewPrivs") == ["1"]  # allowPrivilegeEscalation: false
    assert _proc_field(proc_status, "Seccomp") == ["2"]  # seccompProfile: RuntimeDefault
    # readOnlyRootFilesystem: the container's / is mounted read-only, and so is its token.
    mounts = {m.split()[4]: m.split()[5].split(",") for m in
              Path(f"/proc/{pid}/mountinfo").read_text().splitlines()}  # fmt: skip
    assert "ro" in mounts["/"]
    assert "ro" in mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
    # Its own network namespace, not the node's.
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    code, metrics = _pod_get(pod, "/metrics")
    assert code == 200 and "pmem_csi_reporter_status_writes_total" in metrics
    # No path from the API server to the kubelet: `kubectl logs` fails at the host's blackhole
    # route for the node's address (the logs are in the kubelet's podLogsDir instead).
    with pytest.raises(ApiException) as refused:
        raw.request("GET", POD.path(drv.namespace, pod["metadata"]["name"]) + "/log").read()
    assert f"{realnode.NODE_IP}:10250" in str(refused.value.body), refused.value
    assert list(realnode.pod_log_dir().glob(f"{drv.namespace}_{pod['metadata']['name']}_*"))


def _proc_field(status: str, name: str) -> list[str]:
    (line,) = [x for x in status.splitlines() if x.startswith(f"{name}:")]
    return line.split()[1:]


def _config_digest(built: image_tool.BuiltImage) -> str:
    algo, digest = built.digest.split(":")
    manifest = json.loads((built.layout / "blobs" / algo / digest).read_text())
    return str(manifest["config"]["digest"])


def _memory_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
            return int(limit.read_text())
    raise AssertionError(f"no memory cgroup for {pid}")


def _jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


SERVICE_ACCOUNT = Resource("ServiceAccount", "v1", "serviceaccounts", True)
TOKEN_REVIEW = "/apis/authentication.k8s.io/v1/tokenreviews"
TOKEN_FILE = "var/run/secrets/kubernetes.io/serviceaccount/token"
# The kubernetes client's in-cluster config reads the token file again at the first request a
# minute after it last read it (kubernetes.config.incluster_config: _token_refresh_period).
CLIENT_TOKEN_REFRESH = 60.0
# After that, what the reporter needs to report a change again: a Lease try (1 s), the
# informers' next list after 401s (their backoff is capped at 30 s) and a status write.
RECOVERY_AFTER_REFRESH = 60.0
# The API server caches a token's successful authentication for 10 s (kube-apiserver's
# built-in TokenSuccessCacheTTL): the old token may pass that long after the SA is gone.
AUTH_CACHE = 10.0
# With the tokens refused: how long nothing may change before "nobody leads or writes" holds.
# A replica whose requests worked would take the free Lease within the documented hand-over
# bound and report the change well under a second later (reporter/schedule.py debounce).
NOBODY_LEADS_QUIET = DOCUMENTED_TAKEOVER
WRITES = "pmem_csi_reporter_status_writes_total"


def _token(pid: int) -> str:
    return Path(f"/proc/{pid}/root/{TOKEN_FILE}").read_text()


def _review(raw: RawApi, token: str) -> dict[str, Any]:
    """The API server's verdict on ``token`` (TokenReview, as the admin)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}}  # fmt: skip
    return dict(raw.request_json("POST", TOKEN_REVIEW, body=body).get("status") or {})


def _metric(pod: dict[str, Any], name: str) -> float:
    code, text = _pod_get(pod, "/metrics")
    assert code == 200, code
    for line in text.splitlines():
        if line.split(" ", 1)[0] == name:
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics of {pod['metadata']['name']}")


def _pod_log(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    logs = realnode.pod_log_dir() / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    return "".join(p.read_text(errors="replace") for p in sorted(logs.rglob("*.log")))


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_a_token_the_kubelet_rotates_is_picked_up_by_the_same_reporter_process(
    deploy: Callable, raw: RawApi, node: realnode.Record
) -> None:
    """The kubelet writes a new token into the running pods; the reporter needs it and uses it.

    The pods' tokens are made worthless by giving their ServiceAccount a new UID (deleted and
    created again under its name: a bound token names the UID, and the API server refuses it
    with 401). Nobody may then lead or write. The kubelet keeps the tokens it requested in
    memory only: restarted, it requests new ones for the running pods (bound to the new UID)
    and rewrites their projected volumes. The same containers then lead and write again
    within the client's refresh period, and report a change made while they could not.
    """
    drv, _ = deploy((FAST_READINESS,))
    pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    wait_for(lambda: _all_true(drv), READY_TIMEOUT, "all conditions True")
    wait_for(lambda: any(_metric(p, "pmem_csi_reporter_is_leader") == 1 for p in pods), 60,
             "a replica leading")  # fmt: skip
    sa_name, ns = drv.names.reporter, drv.namespace
    sa = raw.get(SERVICE_ACCOUNT, sa_name, ns)
    assert sa is not None
    before = {}
    for pod in pods:
        pid, token = _pid(pod), _token(_pid(pod))
        claims = _jwt_claims(token)
        assert claims["kubernetes.io"]["serviceaccount"]["uid"] == sa["metadata"]["uid"]
        assert _review(raw, token)["authenticated"] is True
        before[pod["metadata"]["name"]] = (_container(pod), pid, token, claims)

    # (b) The ServiceAccount under the same name, with a new UID (the bundle's object).
    (declared,) = [o for o in drv.objects if o["kind"] == "ServiceAccount"
                   and o["metadata"]["name"] == sa_name]  # fmt: skip
    raw.request("DELETE", SERVICE_ACCOUNT.path(ns, sa_name)).read()
    wait_for(lambda: raw.get(SERVICE_ACCOUNT, sa_name, ns) is None, 60, "the SA gone")
    raw.create(SERVICE_ACCOUNT, declared, ns, field_manager=AS_PULUMI)
    new_sa = raw.get(SERVICE_ACCOUNT, sa_name, ns)
    assert new_sa is not None and new_sa["metadata"]["uid"] != sa["metadata"]["uid"]
    for _, _, token, _ in before.values():
        refused = wait_for(lambda t=token: (r := _review(raw, t)).get("authenticated") is not True
                           and r, AUTH_CACHE + 30, "the old token refused")  # fmt: skip
        print(f"[token] old token: {refused.get('error')}")
    # The reporter's requests fail: neither replica can renew or take the Lease, both log 401.
    wait_for(lambda: all(_metric(p, "pmem_csi_reporter_is_leader") == 0 for p in pods), 60,
             "no replica leading (its Lease requests refused)")  # fmt: skip
    wait_for(lambda: all("401 Unauthorized" in _pod_log(p) for p in pods), 60,
             "401 Unauthorized in both pods' logs")  # fmt: skip
    # A change made now is not reported by anybody.
    writes = {p["metadata"]["name"]: _metric(p, WRITES)
              for p in pods}  # fmt: skip
    changed_at = time.time()
    delete_object(raw, SERVICE, drv.names.metrics_service, ns)

    def reporting() -> tuple[Any, ...]:
        return (condition(drv.status(), "DriverDeployed").get("status"),
                tuple(_metric(p, "pmem_csi_reporter_is_leader") for p in pods),
                tuple(_metric(p, WRITES) for p in pods))  # fmt: skip

    # Not reported, and nobody can: only a leader writes, and leading takes a Lease request
    # the API server accepts. Watched for as long as a replica able to take the Lease would
    # need to lead and write (the documented hand-over bound), not sampled once.
    assert settled(reporting, NOBODY_LEADS_QUIET, NOBODY_LEADS_QUIET + 60,
                   "the status, leadership and writes with no usable token") == (
        "True", (0.0, 0.0), tuple(writes.values()))  # fmt: skip

    # (c) The kubelet restarted: containerd, the pods and the guard stay.
    restarted_at = time.time()
    record = realnode.restart_kubelet()
    node.pids.update(record.pids)
    node.pid_starts.update(record.pid_starts)
    assert realnode.guard_problems() == []

    # (d) A new token in each pod's volume, from the new kubelet, bound to the new UID.
    rotated = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        _, pid, old, old_claims = before[name]
        token = wait_for(lambda pid=pid, old=old: (t := _token(pid)) != old and t, 120,
                         f"a new token in {name}'s volume")  # fmt: skip
        rotated[name] = time.monotonic()
        claims = _jwt_claims(token)
        assert claims["jti"] != old_claims["jti"] and claims["iat"] >= int(restarted_at)
        assert claims["kubernetes.io"]["serviceaccount"]["uid"] == new_sa["metadata"]["uid"]
        assert claims["kubernetes.io"]["pod"]["uid"] == pod["metadata"]["uid"]
        assert _review(raw, token)["authenticated"] is True
        print(f"[token] {name}: new token {claims['iat'] - int(restarted_at)}s after the "
              f"restart began, exp-iat {claims['exp'] - claims['iat']}s")  # fmt: skip

    # The same processes lead and write again with it: the change made before the rotation
    # is in the CR now, written after the new tokens were issued.
    def deployed_false() -> dict[str, Any]:
        cond = condition(drv.status(), "DriverDeployed")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(deployed_false, CLIENT_TOKEN_REFRESH + RECOVERY_AFTER_REFRESH,
                    "DriverDeployed False, written with the new token")  # fmt: skip
    recovered = time.monotonic() - min(rotated.values())
    print(f"[token] the change reported {recovered:.1f}s after the first new token was seen")
    assert f"Service/{drv.names.metrics_service}" in cond["message"], cond
    assert _epoch(cond["lastTransitionTime"]) >= int(restarted_at) > changed_at - 1
    leaders = [p for p in pods if _metric(p, "pmem_csi_reporter_is_leader") == 1]
    (leader,) = leaders
    assert _metric(leader, WRITES) > writes[leader["metadata"]["name"]]
    # Same containers, same processes: no restart, nothing new but the token.
    now = {p["metadata"]["name"]: p for p in drv.pods(_selector(drv))}
    for name, (status, pid, _, _) in before.items():
        assert _container(now[name])["containerID"] == status["containerID"]
        assert _container(now[name])["restartCount"] == status["restartCount"]
        assert _pid(now[name]) == pid


def test_readiness_fails_while_the_crd_is_missing_and_the_pods_are_not_restarted(
    deploy: Callable, raw: RawApi
) -> None:
    drv, _ = deploy()
    pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    restarts = {p["metadata"]["name"]: _container(p)["restartCount"] for p in pods}
    crd_name = load_crd()["metadata"]["name"]
    cr = drv.cr()
    raw.request("DELETE", CRD_RESOURCE.path(None, crd_name)).read()
    try:

        def not_ready() -> list[dict[str, Any]]:
            now = drv.pods(_selector(drv))
            return [p for p in now if not _ready(p)] if len(now) == 2 else []

        unready = wait_for(lambda: len(not_ready()) == 2 and not_ready(), 90, "pods not Ready")
        for pod in unready:
            assert _pod_get(pod, "/readyz")[0] == 503
            assert _pod_get(pod, "/healthz")[0] == 200
            assert _container(pod)["restartCount"] == restarts[pod["metadata"]["name"]]
            assert pod["status"]["phase"] == "Running"
    finally:
        wait_for(lambda: raw.get(CRD_RESOURCE, crd_name) is None, 60, "the CRD gone")
        ensure_crd(raw)
    # The CR went with its CRD; the administrator's `pulumi up --refresh` would make it again.
    cr.pop("status", None)
    meta = cr["metadata"]
    cr["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)}
    raw.create(CR_RESOURCE, cr, field_manager=AS_PULUMI)
    again = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "Ready again")
    assert {p["metadata"]["name"]: _container(p)["restartCount"] for p in again} == restarts


def test_liveness_probe_restarts_a_frozen_reporter(deploy: Callable) -> None:
    drv, _ = deploy((FAST_LIVENESS,))
    pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    pod = pods[0]
    name, before = pod["metadata"]["name"], _container(pod)["restartCount"]
    pid = _pid(pod)
    os.kill(pid, signal.SIGSTOP)  # /healthz no longer answers: the probe times out

    def restarted() -> dict[str, Any]:
        (now,) = [p for p in drv.pods(_selector(drv)) if p["metadata"]["name"] == name]
        status = _container(now)
        if status["restartCount"] > before and status.get("lastState", {}).get("terminated"):
            return now
        raise AssertionError(status)

    now = wait_for(restarted, LIVENESS_TIMEOUT, "the kubelet restarting the frozen container")
    assert not Path(f"/proc/{pid}").exists()
    wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "the restarted pod Ready again")
    assert _pid(now) != pid


def test_a_deleted_leader_pod_hands_the_lease_to_a_live_replica(
    deploy: Callable, raw: RawApi
) -> None:
    """The Lease goes to a pod that is not being deleted: the standby replica or the pod the
    ReplicaSet starts in the deleted one's place, whichever asks first after the release (on
    the real node a replacement starts within a second, so either can win; both are the
    Deployment's replicas)."""
    drv, _ = deploy((FAST_READINESS,))
    pods = wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    names = {p["metadata"]["name"] for p in pods}
    leader = wait_for(lambda: _holder(raw, drv).rsplit("_", 1)[0] in names and _holder(raw, drv),
                      60, "a pod holding the Lease").rsplit("_", 1)[0]  # fmt: skip
    deleted = time.monotonic()
    raw.request("DELETE", POD.path(drv.namespace, leader)).read()

    def live_holder() -> str:
        holder = _holder(raw, drv).rsplit("_", 1)[0]
        live = {
            p["metadata"]["name"]
            for p in drv.pods(_selector(drv))
            if not p["metadata"].get("deletionTimestamp")
        }
        assert holder != leader and holder in live, (holder, sorted(live))
        return holder

    other = wait_for(
        live_holder, TAKEOVER_TIMEOUT, f"a live replica holding the Lease after {leader} was "
        "deleted", interval=0.1,
    )  # fmt: skip
    took = time.monotonic() - deleted
    print(f"[lease] {other} holds the Lease {took:.1f}s after {leader} was deleted")
    assert took <= DOCUMENTED_TAKEOVER, f"hand-over took {took:.1f}s (docs: within 15 s)"
    # The new leader writes: a change made now shows in the status.
    delete_object(raw, SERVICE, drv.names.metrics_service, drv.namespace)

    def deployed_false() -> dict[str, Any]:
        cond = condition(drv.status(), "DriverDeployed")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(deployed_false, READY_TIMEOUT, "DriverDeployed False from the new leader")
    assert f"Service/{drv.names.metrics_service}" in cond["message"], cond


def test_scaled_to_zero_the_reporter_exits_on_sigterm_and_releases_the_lease(
    deploy: Callable, raw: RawApi
) -> None:
    """The kubelet's SIGTERM: a reporter that did not exit within its grace period would be
    killed and leave the Lease held until it expires; with no replica left, nobody else
    would clear it."""
    drv, dep = deploy((FAST_READINESS,))
    wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    wait_for(lambda: _holder(raw, drv), 60, "a Lease holder")
    name = dep["metadata"]["name"]
    raw.request(
        "PATCH",
        APPS_DEPLOYMENT.path(drv.namespace, name) + "/scale",
        body={"spec": {"replicas": 0}},
        content_type="application/merge-patch+json",
    ).read()
    wait_for(lambda: not drv.pods(_selector(drv)), READY_TIMEOUT, "the pods gone")
    assert _holder(raw, drv) == ""


def test_an_allocation_past_the_memory_limit_is_an_oom_kill_in_the_pods_status(
    deploy: Callable,
) -> None:
    """A limit below what the reporter needs to start: the kernel kills it, the pod says so."""
    limit = "24Mi"
    low = {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "jsonPatch": [
            {"op": "replace", "value": limit,
             "path": "/spec/template/spec/containers/0/resources/limits/memory"},
            {"op": "replace", "value": limit,
             "path": "/spec/template/spec/containers/0/resources/requests/memory"},
        ],
    }  # fmt: skip
    drv, _ = deploy((low,))

    def oom_killed() -> dict[str, Any]:
        for pod in drv.pods(_selector(drv)):
            status = _container(pod)
            last = (status.get("lastState") or {}).get("terminated") or {}
            now = (status.get("state") or {}).get("terminated") or {}
            for term in (last, now):
                if term.get("reason") == "OOMKilled":
                    return term
        raise AssertionError([_container(p) for p in drv.pods(_selector(drv))])

    term = wait_for(oom_killed, READY_TIMEOUT, "a reporter container OOMKilled")
    assert term["exitCode"] == 137


# --------------------------------------------------------------------------- pulumi up


def _rollout(raw: RawApi, drv_ns: str, name: str) -> dict[str, Any]:
    dep = raw.get(APPS_DEPLOYMENT, name, drv_ns)
    assert dep is not None
    return dep


def test_pulumi_up_with_a_new_reporter_setting_rolls_the_deployment_and_awaits_ready_pods(
    node: realnode.Record, pulumi_stack: Callable, raw: RawApi, crd: None
) -> None:
    """The provider's await on the reporter Deployment is the kubelet's readiness here."""
    from pmem_components.config import DeploymentConfig
    from pmem_components.program import main as program
    from tools import pulumi_stack as ps

    suffix = uuid.uuid4().hex[:6]
    raw_dep = {
        "name": f"rn-{suffix}.pmem-csi.intel.com",
        "namespace": f"rn-{suffix}",
        "reporter": {"image": REPORTER_IMAGE, "logLevel": 3},
        "patches": [realnode.reporter_patch(), FAST_READINESS],
    }
    config = {
        "pmem-csi:manageCrd": False,
        "pmem-csi:retainNamespaces": False,
        "pmem-csi:deployments": [raw_dep],
    }
    cfg = DeploymentConfig(name=raw_dep["name"], namespace=raw_dep["namespace"])
    name, ns = cfg.names.reporter, cfg.namespace
    stack = pulumi_stack(program, config=config)
    stack.up(on_output=ps.printer("[up 1] "))
    # No waiting here: `pulumi up` returned, so the provider saw the rollout complete.
    first = _rollout(raw, ns, name)
    assert _complete(first), first["status"]
    pods = [p for p in _pods(raw, ns) if p["spec"]["nodeName"] == realnode.NODE_NAME]
    assert len(pods) == 2 and all(_ready(p) for p in pods)
    old = {p["metadata"]["name"] for p in pods}

    raw_dep["reporter"]["logLevel"] = 4
    ps.write_stack_config(Path(stack.workspace.work_dir), stack.name, config)
    result = stack.up(on_output=ps.printer("[up 2] "))
    assert result.summary.resource_changes.get("update", 0) >= 1
    second = _rollout(raw, ns, name)
    assert second["metadata"]["generation"] > first["metadata"]["generation"]
    assert _complete(second), second["status"]
    ready = [p for p in _pods(raw, ns) if _ready(p) and not p["metadata"].get("deletionTimestamp")]
    assert len(ready) == 2 and not old & {p["metadata"]["name"] for p in ready}
    for pod in ready:
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--log-level") + 1] == "4"
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME


def _complete(dep: dict[str, Any]) -> bool:
    status, want = dep.get("status") or {}, dep["spec"]["replicas"]
    return (
        status.get("observedGeneration") == dep["metadata"]["generation"]
        and status.get("updatedReplicas") == want
        and status.get("readyReplicas") == want
        and status.get("availableReplicas") == want
        and not status.get("unavailableReplicas")
    )


def _pods(raw: RawApi, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in raw.list(POD, namespace)[0]
        if any(r.get("kind") == "ReplicaSet" for r in p["metadata"].get("ownerReferences") or [])
    ]


# --------------------------------------------------------------------------- teardown


def test_a_killed_node_is_cleaned_up_at_the_next_start_and_stop_leaves_nothing(
    node: realnode.Record, deploy: Callable
) -> None:
    """Kill every process of the node (as a killed run would), start again, then stop."""
    drv, _ = deploy((FAST_READINESS,))
    wait_for(lambda: _ready_pods(drv, 2), READY_TIMEOUT, "two reporter pods Ready")
    record = realnode.Record.load()
    assert record is not None
    procs = realnode._cgroup_pids(realnode._cgroup_dirs()) | set(record.pids.values())
    for pid in procs:
        os.kill(pid, signal.SIGKILL)
    # What a killed run leaves: pod mounts, cgroups, namespaces, routes.
    assert realnode.leftovers()
    again = realnode.start(images=[(image_tool.build().archive, realnode.REPORTER_IMAGE_BASE)])
    assert realnode.guard_problems() == []
    assert set(again.pids.values()).isdisjoint(procs)
    realnode.stop()
    assert realnode.leftovers() == []  # also: the kernel tunables are the baseline's again
    assert not realnode.RECORD_FILE.exists() and not realnode.BASELINE_FILE.exists()
    assert not any(Path(f"/proc/{pid}").exists() for pid in again.pids.values())

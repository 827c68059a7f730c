"""Deploy a driver from the pure builders and run the reporter against it, for e2e tests.

Why not Pulumi: these tests are about the reporter, and the builders produce exactly the dicts
the Pulumi program registers, so creating them with the admin client gives the reporter the
same objects in seconds instead of a full ``pulumi up``. The reporter's own Deployment is
left out because kwok pods run no code: the reporter runs as a subprocess of the test, with a
kubeconfig holding a TokenRequest token of its ServiceAccount, so the RBAC it is granted by
``build_reporter_objects`` is what the API server enforces.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pmem_components import names as n
from pmem_components.certs import DriverCertificates
from pmem_components.config import DeploymentConfig
from pmem_components.manifests.bundle import CertificateValues, build_deployment_objects
from pmem_components.manifests.crd import load_crd
from reporter import model
from reporter.__main__ import parse_args
from reporter.kubeapi import RawApi, Resource
from tests.e2e.waiting import settled, wait_for

PROJECT_DIR = Path(__file__).resolve().parents[2]

# Where each kind the bundle produces lives in the API (the reporter's table plus the rest).
_RESOURCES: dict[str, Resource] = {
    kind: Resource(kind, api.api_version, api.plural, api.namespaced)
    for kind, api in model.API_RESOURCES.items()
}
_RESOURCES["Namespace"] = Resource("Namespace", "v1", "namespaces", False)
# Two kinds are called "Deployment": the apps/v1 one (the reporter's) and our CR.
APPS_DEPLOYMENT = Resource("Deployment", "apps/v1", "deployments", True)
CR_RESOURCE = Resource(n.CRD_KIND, f"{n.CRD_GROUP}/{n.CRD_STORAGE_VERSION}", n.CRD_PLURAL, False)
CRD_RESOURCE = Resource(
    "CustomResourceDefinition", "apiextensions.k8s.io/v1", "customresourcedefinitions", False
)


def resource_of(obj: dict[str, Any]) -> Resource:
    """The API location of a builder object, by kind and apiVersion."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    for special in (APPS_DEPLOYMENT, CR_RESOURCE):
        if (kind, api_version) == (special.kind, special.api_version):
            return special
    res = _RESOURCES.get(kind)
    if res is None or res.api_version != api_version:
        raise KeyError(f"no API table entry for {api_version} {kind}")
    return res


# --------------------------------------------------------------------------- cluster objects


def ensure_crd(raw: RawApi) -> bool:
    """Create the CRD from ``crd/`` unless it exists; True when this call created it.

    An existing CRD is left alone: other engineers' tests (and Pulumi stacks) may own it.
    """
    crd = load_crd()
    created = False
    if raw.get(CRD_RESOURCE, crd["metadata"]["name"]) is None:
        try:
            raw.create(CRD_RESOURCE, crd)
            created = True
        except ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool:
        obj = raw.get(CRD_RESOURCE, crd["metadata"]["name"]) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

    wait_for(established, 30, "CRD Established")
    return created


def delete_object(raw: RawApi, res: Resource, name: str, namespace: str | None = None) -> None:
    """Delete one object; a missing one is fine (cleanup runs after tests that delete)."""
    try:
        raw.request(
            "DELETE",
            res.path(namespace, name),
            body={"propagationPolicy": "Background"},
        ).read()
    except ApiException as exc:
        if exc.status != 404:
            raise


@dataclass
class Driver:
    """One deployed driver: its config, the objects created for it, and API handles."""

    cfg: DeploymentConfig
    raw: RawApi
    objects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def namespace(self) -> str:
        return self.cfg.namespace

    @property
    def names(self) -> n.DeploymentNames:
        return self.cfg.names

    def cr(self) -> dict[str, Any]:
        obj = self.raw.get(CR_RESOURCE, self.name)
        assert obj is not None, f"CR {self.name} is gone"
        return obj

    def status(self) -> dict[str, Any]:
        return dict(self.cr().get("status") or {})

    def pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        pod = Resource("Pod", "v1", "pods", True)
        return self.raw.list(pod, self.namespace, label_selector=label_selector)[0]

    def node_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods()
            if any(
                r.get("kind") == "DaemonSet" and r.get("name") == self.names.node_driver
                for r in (p.get("metadata") or {}).get("ownerReferences") or []
            )
        ]

    def delete(self) -> None:
        """Remove the CR, the cluster-scoped objects and the namespace (not waiting for it)."""
        for obj in reversed(self.objects):
            res = resource_of(obj)
            ns = obj["metadata"].get("namespace") if res.namespaced else None
            if ns == self.namespace:
                continue  # the namespace's deletion takes them along
            delete_object(self.raw, res, obj["metadata"]["name"], ns)
        # Events about the cluster-scoped CR live outside the driver's namespace.
        events = Resource("Event", "v1", "events", True)
        ns = n.CLUSTER_EVENT_NAMESPACE
        with contextlib.suppress(ApiException):
            items, _ = self.raw.list(events, ns, field_selector=f"involvedObject.name={self.name}")
            for ev in items:
                delete_object(self.raw, events, ev["metadata"]["name"], ns)


# What the tests create or change in Pulumi's stead is written under a manager named as the
# Pulumi Kubernetes provider names its own: the reporter reports fields owned by any other
# manager as changed behind Pulumi's back (pmem_components.fieldowners).
AS_PULUMI = "pulumi-kubernetes-e2e"

# The reporter's objects (ServiceAccount, RBAC) exist only with an image set; kwok's pods run
# none, and tests/e2e/test_reporter_image.py runs the real one.
REPORTER_IMAGE = "registry.example/pmem-csi-reporter:e2e"


def driver_config(
    name: str, namespace: str, reporter_image: str = REPORTER_IMAGE
) -> DeploymentConfig:
    """The default config, renamed so concurrent tests do not share objects."""
    return DeploymentConfig(name=name, namespace=namespace, reporter={"image": reporter_image})


def deploy_driver(raw: RawApi, cfg: DeploymentConfig, certs: DriverCertificates) -> Driver:
    """Create every object of ``cfg`` (but the reporter's Deployment), CR last.

    The reporter's ServiceAccount and RBAC come from the same bundle, i.e. from
    ``build_reporter_objects``, so the tests exercise the least-privilege rules we ship.
    """
    values = CertificateValues(
        certs.ca_cert,
        certs.registry_cert,
        certs.registry_key,
        certs.node_controller_cert,
        certs.node_controller_key,
    )
    bundle = build_deployment_objects(cfg, values, create_namespace=True)
    driver = Driver(cfg, raw)
    try:
        for obj in bundle.all():
            res = resource_of(obj)
            if res is APPS_DEPLOYMENT:
                continue  # the reporter runs as a subprocess of the test instead
            ns = obj["metadata"].get("namespace") if res.namespaced else None
            raw.create(res, obj, ns, field_manager=AS_PULUMI)
            driver.objects.append(obj)
    except BaseException:
        driver.delete()
        raise
    return driver


# --------------------------------------------------------------------------- credentials


def token_kubeconfig(
    api_client: client.ApiClient,
    admin_kubeconfig: Path,
    service_account: str,
    namespace: str,
    out: Path,
    expiration_seconds: int = 3600,
) -> Path:
    """A kubeconfig authenticating as ``service_account`` with a TokenRequest token.

    The server URL and CA come from the admin kubeconfig; no client certificate is copied,
    so everything the reporter does is authorized by its own RBAC.
    """
    core = client.CoreV1Api(api_client)
    token = core.create_namespaced_service_account_token(
        service_account,
        namespace,
        {"spec": {"expirationSeconds": expiration_seconds}},
    ).status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text(encoding="utf-8"))
    ctx_name = admin["current-context"]
    ctx = next(c["context"] for c in admin["contexts"] if c["name"] == ctx_name)
    cluster = dict(next(c["cluster"] for c in admin["clusters"] if c["name"] == ctx["cluster"]))
    ca = cluster.get("certificate-authority")
    if ca and not os.path.isabs(ca):
        cluster["certificate-authority"] = str((admin_kubeconfig.parent / ca).resolve())
    user = f"system:serviceaccount:{namespace}:{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "reporter", "context": {"cluster": "local", "user": user}}],
        "current-context": "reporter",
    }
    out.write_text(yaml.safe_dump(config), encoding="utf-8")
    out.chmod(0o600)
    return out


# --------------------------------------------------------------------------- the reporter


_PORT_LINE = re.compile(r"serving /healthz /readyz /metrics on port (\d+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class ReporterProcess:
    """``python -m reporter`` as a child process, with its port and log at hand."""

    def __init__(
        self,
        kubeconfig: Path,
        deployment: str,
        namespace: str,
        identity: str,
        log_path: Path,
        resync_seconds: float = 5.0,
        extra_args: tuple[str, ...] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.identity = identity
        self.log_path = log_path
        args = [
            sys.executable,
            "-m",
            "reporter",
            "--kubeconfig",
            str(kubeconfig),
            "--deployment",
            deployment,
            "--namespace",
            namespace,
            "--metrics-port",
            "0",
            "--identity",
            identity,
            "--resync-seconds",
            str(resync_seconds),
            "--log-level",
            "DEBUG",
            *extra_args,
        ]
        # Its settings as it parses them (defaults included), for waits derived from them.
        self.settings = parse_args(args[3:])
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(extra_env or {})  # e.g. what its Deployment's container sets
        self._log = log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            args,
            cwd=PROJECT_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.port: int | None = None
        self._port_ready = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        if not self._port_ready.wait(30) or self.port is None:
            self.stop()
            raise AssertionError(f"reporter {identity} printed no port; log:\n{self.log()}")

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = _PORT_LINE.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._port_ready.set()
        self._port_ready.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        # The child writes to the file directly; our handle never buffers anything.
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics keyed by name plus labels, e.g. 'x_total' or 'x{a="b"}'."""
        _, text = self.get("/metrics")
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line.strip())
            if match and not line.startswith("#"):
                out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
        return out

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def quiet_seconds(self) -> float:
        """How long without a change shows that the reporter has written all it has seen.

        A change it has seen is written at once, at the next resync at the latest, or, when a
        message-only write was put off for want of a token, within one message interval
        (reporter/write.py); twice the longest of these, as the machine may be loaded.
        """
        s = self.settings
        return 2 * max(s.resync_seconds, 1.0, s.message_interval)

    def settled_metrics(
        self,
        names: tuple[str, ...],
        cr_version: Callable[[], Any] | None = None,
        timeout: float = 120.0,
    ) -> dict[str, float]:
        """The counters ``names`` once they (and ``cr_version()``, e.g. the CR's
        resourceVersion, which every status write moves) stayed unchanged for
        ``quiet_seconds``: no write already under way can still be counted after this, so a
        later comparison sees only what happens after it."""

        def read() -> tuple[dict[str, float], Any]:
            m = self.metrics()
            return {k: m.get(k, 0.0) for k in names}, cr_version() if cr_version else None

        what = f"reporter {self.identity}'s {', '.join(names)}"
        return settled(read, self.quiet_seconds(), timeout, what)[0]

    def kill(self) -> None:
        """SIGKILL: no Lease release, no cleanup; what a crashed node looks like."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def container_status_patch(
    pod: dict[str, Any], waiting_reason: str | None, message: str | None = None
) -> dict[str, Any]:
    """A pod status patch as the kubelet writes it: every container waiting with
    ``waiting_reason`` and the pod not Ready (a crash loop, say), or, with None, every
    container running and the pod Ready. kwok runs no containers, so tests play the kubelet.
    """
    ready = waiting_reason is None
    if ready:
        state: dict[str, Any] = {
            "waiting": None,
            "running": {"startedAt": "2026-01-01T00:00:00Z"},
        }
        conditions = [
            {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
        ]
    else:
        waiting = {"reason": waiting_reason, **({"message": message} if message else {})}
        state = {"running": None, "waiting": waiting}
        conditions = [
            {"type": t, "status": "False", "reason": "ContainersNotReady"}
            for t in ("Ready", "ContainersReady")
        ]
    return {
        "status": {
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 5,
                    "state": state,
                }
                for c in pod["spec"]["containers"]
            ],
        }
    }


@contextlib.contextmanager
def reporter_starter(
    api_client: client.ApiClient, admin_kubeconfig: Path, driver: Driver, workdir: Path
) -> Iterator[Callable[..., ReporterProcess]]:
    """A factory of reporter processes for ``driver``, each with a fresh token of its
    ServiceAccount; on exit every one is resumed (a test may have frozen it), stopped, and
    the tail of its log printed, which is where a failure's reason usually is.

    ``start(identity, resync_seconds, kubeconfig_hook=None)``: the hook may rewrite the
    reporter's kubeconfig before it starts (e.g. to reach the API server through a proxy).
    """
    started: list[ReporterProcess] = []

    def start(
        identity: str = "r1",
        resync_seconds: float = 5.0,
        kubeconfig_hook: Callable[[Path], None] | None = None,
    ) -> ReporterProcess:
        kubeconfig = token_kubeconfig(
            api_client,
            admin_kubeconfig,
            driver.names.reporter,
            driver.namespace,
            workdir / f"kubeconfig-{identity}-{len(started)}",
        )
        if kubeconfig_hook is not None:
            kubeconfig_hook(kubeconfig)
        proc = ReporterProcess(
            kubeconfig,
            driver.name,
            driver.namespace,
            identity,
            workdir / f"reporter-{identity}-{len(started)}.log",
            resync_seconds=resync_seconds,
            # The watch layout the program deploys (one reporter per stack).
            extra_args=("--shared-watches",),
        )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.stop()
        for proc in started:
            print(f"===== reporter {proc.identity} (pid {proc.pid}) log =====")
            print(proc.log()[-20000:])


@contextlib.contextmanager
def running(proc: ReporterProcess) -> Iterator[ReporterProcess]:
    try:
        yield proc
    finally:
        proc.stop()


# --------------------------------------------------------------------------- status access


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in status.get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return {}


def component(status: dict[str, Any], name: str) -> dict[str, Any]:
    for comp in status.get("driverComponents") or []:
        if comp.get("component") == name:
            return comp
    return {}

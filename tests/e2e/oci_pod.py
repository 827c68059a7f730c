"""Run one container of a Deployment built by the program with runc, the way a kubelet would.

Why: kwok's pods run no code, so the pod spec the program writes (arguments, user, read-only
root, memory limit, ServiceAccount credentials) would otherwise never run anything. This
module turns the builder's Deployment dict into an OCI runtime spec: every field that changes
how the container runs is read from the dict, and a field this module does not know is an
error, so a change to the builder cannot pass unnoticed.

What a kubelet does and this does too:
- process: the image's Entrypoint (or the container's ``command``) plus the container's
  ``args`` (which replace the image's Cmd); the image's Env, then the variables a kubelet adds
  (``KUBERNETES_SERVICE_HOST``/``PORT`` and friends, ``HOSTNAME``), then the container's
  ``env`` (``value`` and the ``fieldRef``s a pod can have); working directory.
- user and group from the pod's and the container's ``securityContext`` (the container's
  wins), ``runAsNonRoot`` refused for uid 0, ``readOnlyRootFilesystem``,
  ``allowPrivilegeEscalation`` (no_new_privs), ``capabilities`` add/drop against the default
  set of containerd/CRI-O, ``seccompProfile``.
- ``resources``: memory limit as the cgroup limit, CPU request as cpu shares, CPU limit as
  CFS quota.
- volumes: the ServiceAccount token volume at /var/run/secrets/kubernetes.io/serviceaccount
  (``token``, ``ca.crt``, ``namespace``; unless ``automountServiceAccountToken: false``),
  ``emptyDir`` volumes, a generated /etc/hosts; a pod hostname (UTS namespace) equal to the
  pod's name; own PID, IPC and mount namespaces.
- stop: SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds``.

Networking: the pod gets its own network namespace (only ``lo``), like a pod; the API
server, which listens on the host's loopback, is made reachable at the same address inside
it by a forwarder of the test (``netns.Forwarder``), and ``KUBERNETES_SERVICE_HOST``/``PORT``
name that address (a real pod gets a ClusterIP; the local API server's certificate names
127.0.0.1, not a service IP). The test reaches the pod's port from inside its namespace.

``seccompProfile: RuntimeDefault`` is the default profile of CRI-O and Podman
(``/usr/share/containers/seccomp.json`` from containers-common, which comes with skopeo),
resolved for amd64 and the container's capabilities as CRI-O does.

Where it differs, stated: probes are not run periodically, the test requests their paths
itself; the token is a TokenRequest token for the ServiceAccount, not bound to a pod object;
no pod IP, Service or DNS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.e2e import netns

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The default seccomp profile of CRI-O and Podman (containers-common, installed with skopeo):
# what a pod's `seccompProfile: RuntimeDefault` means on a CRI-O node.
RUNTIME_DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")
OCI_ARCH = "amd64"
# containerd's and CRI-O's default capability set; `drop: [ALL]` empties it.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)  # fmt: skip

# Every pod spec / container field this module knows, and what it does with it. Anything
# else in the builder's dict fails `check_supported`, so the harness cannot silently ignore
# a new field.
POD_FIELDS = {
    "containers": "run (one of them)",
    "serviceAccountName": "credentials",
    "automountServiceAccountToken": "credentials",
    "securityContext": "user, group, runAsNonRoot",
    "terminationGracePeriodSeconds": "stop",
    "volumes": "emptyDir",
    "affinity": "scheduling only",
    "nodeSelector": "scheduling only",
    "tolerations": "scheduling only",
    "priorityClassName": "scheduling only",
}
CONTAINER_FIELDS = {
    "name": "identity",
    "image": "checked against the image run",
    "imagePullPolicy": "pulling only",
    "command": "process",
    "args": "process",
    "env": "process",
    "workingDir": "process",
    "ports": "the port the test reaches (in the pod's network namespace)",
    "livenessProbe": "requested by the test",
    "readinessProbe": "requested by the test",
    "resources": "cgroup limits",
    "securityContext": "user, read-only root, capabilities, no_new_privs",
    "volumeMounts": "mounts",
    "terminationMessagePath": "not emulated (nothing reads it)",
}
POD_SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile",
                       "supplementalGroups"}  # fmt: skip
CONTAINER_SECURITY_FIELDS = {
    "runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem",
    "allowPrivilegeEscalation", "capabilities", "seccompProfile",
}  # fmt: skip


class Unsupported(AssertionError):
    """The Deployment asks for something this harness cannot reproduce faithfully."""


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container_of(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == name]
    return found


def check_supported(deployment: dict[str, Any], container_name: str) -> None:
    spec = pod_spec(deployment)
    unknown = [f"spec.{k}" for k in spec if k not in POD_FIELDS]
    unknown += [
        f"securityContext.{k}"
        for k in spec.get("securityContext") or {}
        if k not in POD_SECURITY_FIELDS
    ]
    if len(spec["containers"]) != 1 or spec.get("initContainers"):
        unknown.append("more than one container")
    ctr = container_of(deployment, container_name)
    unknown += [f"container.{k}" for k in ctr if k not in CONTAINER_FIELDS]
    unknown += [
        f"container.securityContext.{k}"
        for k in ctr.get("securityContext") or {}
        if k not in CONTAINER_SECURITY_FIELDS
    ]
    if unknown:
        raise Unsupported(f"the runc harness does not reproduce {', '.join(unknown)}")


# --------------------------------------------------------------------------- quantities

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def quantity(value: str | int) -> float:
    """A Kubernetes quantity ("256Mi", "10m", 2) as a number."""
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in _SUFFIX:
        raise Unsupported(f"quantity {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


# --------------------------------------------------------------------------- image


def image_config(layout: Path) -> dict[str, Any]:
    """The ``config`` object of the only image in an OCI layout (Entrypoint, Env, User...)."""

    def blob(digest: str) -> dict[str, Any]:
        algo, hexd = digest.split(":", 1)
        return json.loads((layout / "blobs" / algo / hexd).read_text(encoding="utf-8"))

    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    (desc,) = index["manifests"]
    manifest = blob(desc["digest"])
    return dict(blob(manifest["config"]["digest"]).get("config") or {})


def unpack(layout_ref: str, bundle: Path) -> Path:
    """``umoci unpack`` the image into ``bundle``; returns its root filesystem."""
    subprocess.run(
        ["umoci", "unpack", "--image", layout_ref, str(bundle)],
        check=True,
        capture_output=True,
    )
    return bundle / "rootfs"


# --------------------------------------------------------------------------- credentials


@dataclass
class ApiEndpoint:
    host: str
    port: int
    ca_pem: bytes


def api_endpoint(kubeconfig: Path) -> ApiEndpoint:
    """Where the pod reaches the API server, from the admin kubeconfig's current cluster."""
    import base64

    cfg = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    url = urllib.parse.urlsplit(cluster["server"])
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"])
    else:
        path = Path(cluster["certificate-authority"])
        ca = (path if path.is_absolute() else kubeconfig.parent / path).read_bytes()
    return ApiEndpoint(str(url.hostname), int(url.port or 443), ca)


def write_service_account_volume(
    api_client: Any,
    endpoint: ApiEndpoint,
    service_account: str,
    namespace: str,
    out: Path,
    owner_uid: int,
    expiration_seconds: int = 3600,
) -> Path:
    """The files of the projected ServiceAccount volume: a TokenRequest token, CA, namespace.

    Modes as a kubelet writes them for a pod with ``runAsUser`` (token readable by that user
    only).
    """
    token = (
        client.CoreV1Api(api_client)
        .create_namespaced_service_account_token(
            service_account, namespace, {"spec": {"expirationSeconds": expiration_seconds}}
        )
        .status.token
    )
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)
    for name, data, mode in (
        ("token", token.encode(), 0o600),
        ("ca.crt", endpoint.ca_pem, 0o644),
        ("namespace", namespace.encode(), 0o644),
    ):
        path = out / name
        path.write_bytes(data)
        os.chown(path, owner_uid, 0)
        path.chmod(mode)
    return out


# --------------------------------------------------------------------------- the spec


def _default_spec(work: Path) -> dict[str, Any]:
    """runc's own default spec (mounts, masked paths), the base a CRI runtime also starts from."""
    tmp = work / "runc-default-spec"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").unlink(missing_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(tmp)], check=True, capture_output=True)
    return json.loads((tmp / "config.json").read_text(encoding="utf-8"))


def _env(
    image_env: list[str], container: dict[str, Any], pod_name: str, namespace: str,
    service_account: str, endpoint: ApiEndpoint,
) -> list[str]:  # fmt: skip
    env: dict[str, str] = {}
    for item in image_env:
        key, _, value = item.partition("=")
        env[key] = value
    host, port = endpoint.host, str(endpoint.port)
    env.update(
        {
            "HOSTNAME": pod_name,
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
            f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
            f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
            f"KUBERNETES_PORT_{port}_TCP_PORT": port,
            f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
        }
    )
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": namespace,
        "spec.serviceAccountName": service_account,
    }
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        ref = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref not in fields:
            raise Unsupported(f"env {var['name']}: {var.get('valueFrom')}")
        env[var["name"]] = fields[ref]
    return [f"{k}={v}" for k, v in env.items()]


def _user(pod: dict[str, Any], container: dict[str, Any], image_user: str) -> tuple[int, int]:
    psc = pod.get("securityContext") or {}
    csc = container.get("securityContext") or {}
    img_uid, _, img_gid = (image_user or "0").partition(":")
    if not img_uid.isdigit() or (img_gid and not img_gid.isdigit()):
        raise Unsupported(f"image user {image_user!r} is not numeric")
    uid = csc.get("runAsUser", psc.get("runAsUser", int(img_uid)))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", int(img_gid or 0)))
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and uid == 0:
        raise AssertionError("runAsNonRoot is set but the container would run as uid 0")
    return int(uid), int(gid)


def _capabilities(container: dict[str, Any]) -> list[str]:
    caps = ((container.get("securityContext") or {}).get("capabilities")) or {}
    drop = {f"CAP_{c}" for c in caps.get("drop") or []}
    have = [] if "CAP_ALL" in drop else [c for c in DEFAULT_CAPABILITIES if c not in drop]
    return have + [f"CAP_{c}" for c in caps.get("add") or [] if f"CAP_{c}" not in have]


def _seccomp(pod: dict[str, Any], container: dict[str, Any], caps: list[str]) -> dict | None:
    """The OCI seccomp section for the pod's/container's ``seccompProfile`` (container wins).

    ``RuntimeDefault`` is the containers-common profile, resolved as CRI-O resolves it: rules
    for this architecture and for the capabilities the container keeps.
    """
    profile = (container.get("securityContext") or {}).get("seccompProfile") or (
        pod.get("securityContext") or {}
    ).get("seccompProfile")
    kind = (profile or {}).get("type", "Unconfined")
    if kind == "Unconfined":
        return None
    if kind != "RuntimeDefault" or not RUNTIME_DEFAULT_SECCOMP.is_file():
        raise Unsupported(f"seccompProfile {profile} (have {RUNTIME_DEFAULT_SECCOMP})")
    src = json.loads(RUNTIME_DEFAULT_SECCOMP.read_text(encoding="utf-8"))
    arches = next(
        [m["architecture"], *m.get("subArchitectures", [])]
        for m in src["archMap"]
        if m["architecture"] == "SCMP_ARCH_X86_64"
    )

    def applies(rule: dict[str, Any]) -> bool:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if inc.get("arches") and OCI_ARCH not in inc["arches"]:
            return False
        if any(c not in caps for c in inc.get("caps") or []):
            return False
        if OCI_ARCH in (exc.get("arches") or []):
            return False
        return not any(c in caps for c in exc.get("caps") or [])

    syscalls = []
    for rule in src["syscalls"]:
        if applies(rule):
            out = {"names": rule["names"], "action": rule["action"]}
            if rule.get("args"):
                out["args"] = rule["args"]
            if rule.get("errnoRet") is not None:
                out["errnoRet"] = rule["errnoRet"]
            syscalls.append(out)
    section: dict[str, Any] = {
        "defaultAction": src["defaultAction"],
        "architectures": arches,
        "syscalls": syscalls,
    }
    if src.get("defaultErrnoRet") is not None:
        section["defaultErrnoRet"] = src["defaultErrnoRet"]
    return section


def _resources(container: dict[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    out: dict[str, Any] = {}
    if "memory" in limits:
        out["memory"] = {"limit": int(quantity(limits["memory"]))}
    cpu: dict[str, Any] = {}
    if "cpu" in requests:
        cpu["shares"] = max(2, int(quantity(requests["cpu"]) * 1024))
    if "cpu" in limits:
        cpu["quota"], cpu["period"] = int(quantity(limits["cpu"]) * 100000), 100000
    if cpu:
        out["cpu"] = cpu
    return out


def _mounts(
    pod: dict[str, Any], container: dict[str, Any], sa_volume: Path | None, work: Path,
    pod_name: str,
) -> list[dict[str, Any]]:  # fmt: skip
    mounts: list[dict[str, Any]] = []
    hosts = work / "etc-hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{pod_name}\n")
    hosts.chmod(0o644)
    mounts.append(_bind(hosts, "/etc/hosts", read_only=False))
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for vm in container.get("volumeMounts") or []:
        vol = volumes.get(vm["name"])
        if vol is None or set(vol) - {"name", "emptyDir"}:
            raise Unsupported(f"volume {vm['name']}: only emptyDir is reproduced ({vol})")
        empty = vol["emptyDir"] or {}
        if empty.get("medium") == "Memory":
            size = empty.get("sizeLimit")
            opts = ["nosuid", "nodev", "mode=1777"] + (
                [f"size={int(quantity(size))}"] if size else []
            )
            mounts.append({"destination": vm["mountPath"], "type": "tmpfs", "source": "tmpfs",
                           "options": opts})  # fmt: skip
        else:
            src = work / "volumes" / vm["name"]
            src.mkdir(parents=True, exist_ok=True)
            src.chmod(0o777)  # as a kubelet creates an emptyDir
            mounts.append(_bind(src, vm["mountPath"], read_only=bool(vm.get("readOnly"))))
    if sa_volume is not None:
        mounts.append(_bind(sa_volume, SA_DIR, read_only=True))
    return mounts


def _bind(src: Path, dest: str, read_only: bool) -> dict[str, Any]:
    opts = ["rbind", "nosuid", "nodev"] + (["ro"] if read_only else ["rw"])
    return {"destination": dest, "type": "bind", "source": str(src), "options": opts}


@dataclass
class PodRun:
    """The runtime spec of one pod of a Deployment, and what the test needs to reach it."""

    spec: dict[str, Any]
    pod_name: str
    uid: int
    gid: int
    ports: dict[str, int]
    grace_seconds: float
    api: ApiEndpoint
    probes: dict[str, str] = field(default_factory=dict)


def build_runtime_spec(
    deployment: dict[str, Any],
    container_name: str,
    img: dict[str, Any],
    rootfs: Path,
    pod_name: str,
    endpoint: ApiEndpoint,
    sa_volume_for: Any,
    work: Path,
) -> PodRun:
    """The OCI runtime spec for ``container_name`` of ``deployment``'s pod template.

    ``sa_volume_for(service_account, namespace, uid)`` writes the ServiceAccount volume and
    returns its directory; it is called only when the pod mounts the token.
    """
    check_supported(deployment, container_name)
    pod = pod_spec(deployment)
    ctr = container_of(deployment, container_name)
    namespace = deployment["metadata"]["namespace"]
    sa = pod.get("serviceAccountName", "default")
    uid, gid = _user(pod, ctr, str(img.get("User") or ""))
    sa_volume = (
        sa_volume_for(sa, namespace, uid) if pod.get("automountServiceAccountToken", True) else None
    )
    spec = _default_spec(work)
    process = spec["process"]
    process["terminal"] = False
    entry = list(ctr.get("command") or img.get("Entrypoint") or [])
    args = list(ctr["args"]) if "args" in ctr else list(img.get("Cmd") or [])
    process["args"] = entry + args
    process["env"] = _env(list(img.get("Env") or []), ctr, pod_name, namespace, sa, endpoint)
    process["cwd"] = ctr.get("workingDir") or img.get("WorkingDir") or "/"
    groups = [int(g) for g in (pod.get("securityContext") or {}).get("supplementalGroups", [])]
    process["user"] = {"uid": uid, "gid": gid, **({"additionalGids": groups} if groups else {})}
    csc = ctr.get("securityContext") or {}
    process["noNewPrivileges"] = not csc.get("allowPrivilegeEscalation", True)
    caps = _capabilities(ctr)
    process["capabilities"] = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    process["capabilities"].update({"inheritable": [], "ambient": []})
    spec["root"] = {"path": str(rootfs), "readonly": bool(csc.get("readOnlyRootFilesystem"))}
    spec["hostname"] = pod_name
    spec["mounts"] = spec["mounts"] + _mounts(pod, ctr, sa_volume, work, pod_name)
    linux = spec["linux"]
    # The pod's own network namespace (runc's default spec has one; runc brings up lo).
    assert {"type": "network"} in linux["namespaces"]
    linux["resources"] = {**linux.get("resources", {}), **_resources(ctr)}
    seccomp = _seccomp(pod, ctr, caps)
    if seccomp is not None:
        linux["seccomp"] = seccomp
    ports = {p.get("name", str(p["containerPort"])): int(p["containerPort"])
             for p in ctr.get("ports") or []}  # fmt: skip
    probes = {}
    for kind in ("livenessProbe", "readinessProbe"):
        http = (ctr.get(kind) or {}).get("httpGet")
        if http:
            port = http["port"]
            probes[kind] = f"{http.get('path', '/')}@{ports.get(port, port)}"
    return PodRun(
        spec=spec,
        pod_name=pod_name,
        uid=uid,
        gid=gid,
        ports=ports,
        grace_seconds=float(pod.get("terminationGracePeriodSeconds", 30)),
        api=endpoint,
        probes=probes,
    )


# --------------------------------------------------------------------------- running


class RuncContainer:
    """One pod's container under runc, with the API server reachable from its network.

    ``runc create`` sets up the namespaces, then the forwarder starts listening at the API
    server's address inside the pod's network namespace, then ``runc start`` runs the
    process: the reporter never sees a network without its API server. Output goes to a log
    file (runc passes its stdio through to the container).
    """

    def __init__(self, run: PodRun, bundle: Path, state_root: Path) -> None:
        self.run = run
        self.id = run.pod_name
        self.bundle = bundle
        self.state_root = state_root
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(run.spec, indent=1), encoding="utf-8")
        self.log_path = bundle / "container.log"
        self.forwarder: netns.Forwarder | None = None
        with self.log_path.open("w", encoding="utf-8") as log:
            subprocess.run(
                ["runc", "--root", str(state_root), "create", "--bundle", str(bundle), self.id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=60,
            )
        try:
            api = (run.api.host, run.api.port)
            self.forwarder = netns.Forwarder(self.pid(), listen=api, target=api)
            self._runc("start", self.id)
        except BaseException:
            self._delete()
            raise

    def _runc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runc", "--root", str(self.state_root), *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def state(self) -> dict[str, Any]:
        out = self._runc("state", self.id, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def pid(self) -> int:
        """The container's init process (the reporter) as the host sees it."""
        return int(self.state().get("pid") or 0)

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A second process in the container, with the container's user and environment."""
        return self._runc("exec", self.id, *argv, check=False)

    def alive(self) -> bool:
        return self.state().get("status") in ("created", "running")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str, port_name: str) -> tuple[int, str]:
        """An HTTP GET on the pod's port, from inside the pod's network namespace."""
        url = f"http://127.0.0.1:{self.run.ports[port_name]}{path}"

        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        return netns.run_in_netns(self.pid(), fetch)

    def _wait_stopped(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def kill(self) -> None:
        """SIGKILL, as when a node dies: no Lease release, no cleanup."""
        if self.alive():
            self._runc("kill", self.id, "KILL", check=False)
            self._wait_stopped(30)
        self._delete()

    def stop(self) -> bool:
        """SIGTERM, SIGKILL after the grace period (what a kubelet does on pod deletion).

        True when the container exited by itself within the grace period.
        """
        graceful = True
        if self.alive():
            self._runc("kill", self.id, "TERM", check=False)
            if not self._wait_stopped(self.run.grace_seconds):
                graceful = False
                self._runc("kill", self.id, "KILL", check=False)
                self._wait_stopped(30)
        self._delete()
        return graceful

    def _delete(self) -> None:
        if self.forwarder is not None:
            self.forwarder.close()
        self._runc("delete", "--force", self.id, check=False)


def memory_limit_of(pid: int) -> int | None:
    """The memory cgroup limit of ``pid`` (cgroup v1 or v2), from the host's view."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
            if v1.exists():
                return int(v1.read_text())
        if controllers == "":
            v2 = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"
            if v2.exists() and v2.read_text().strip() != "max":
                return int(v2.read_text())
    return None

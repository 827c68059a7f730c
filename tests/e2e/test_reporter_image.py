"""The reporter image, built by ``tools.image``, run by runc as the program's Deployment says.

The image is built once (cached by its inputs, as ``make image`` does); the driver is deployed
from the pure builders (as in test_reporter.py) with ``reporter.image`` naming the built image
by digest; the reporter's Deployment dict comes from the same builder the Pulumi program uses,
and ``oci_pod`` turns it into the runtime spec, so arguments, user, read-only root, volumes,
environment and memory limit are the Deployment's, not copies. Credentials are the in-cluster
ones: a TokenRequest token of the reporter's ServiceAccount, the CA and the namespace at
/var/run/secrets/kubernetes.io/serviceaccount, ``KUBERNETES_SERVICE_HOST``/``PORT`` at the local
API server, reached from the pod's own network namespace through a forwarder (see
``oci_pod``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pmem_components import certs as certs_mod
from pmem_components.manifests import bundle
from reporter.kubeapi import RawApi, Resource
from reporter.leader import LEASE
from tests.e2e import oci_pod
from tests.e2e.reporter_helpers import (
    Driver,
    component,
    condition,
    delete_object,
    deploy_driver,
    driver_config,
    ensure_crd,
)
from tests.e2e.waiting import wait_for
from tools import image as image_tool

IN_CI = any(
    os.environ.get(var, "").lower() in {"1", "true", "yes"}
    for var in ("CI", "PMEM_CSI_REQUIRE_CLUSTER")
)
CONTAINER = "reporter"
CONDITIONS = ("CertsReady", "CertsVerified", "DriverDeployed")
# Start (imports in a 10m-CPU-request container on a shared machine), list, first write.
STATUS_TIMEOUT = 180.0
# Lease duration 10 s plus a retry period: a fresh replica takes over a killed leader's Lease.
TAKEOVER_TIMEOUT = 60.0
SERVICE = Resource("Service", "v1", "services", True)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built() -> image_tool.BuiltImage:
    """The image as ``make image`` builds it (from the cache when its inputs are unchanged)."""
    if os.geteuid() != 0:
        _unavailable("building and running the image needs root (mmdebstrap, chroot, runc)")
    try:
        return image_tool.build()
    except image_tool.ImageError as err:
        pytest.fail(f"image build failed: {err}")


@pytest.fixture(scope="module")
def rootfs(built: image_tool.BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return oci_pod.unpack(built.ref, tmp_path_factory.mktemp("bundle") / "unpacked")


@pytest.fixture(scope="module")
def img_config(built: image_tool.BuiltImage) -> dict[str, Any]:
    return oci_pod.image_config(built.layout)


# --------------------------------------------------------------------------- the image


def test_the_image_holds_the_reporter_and_its_pinned_packages_only(
    built: image_tool.BuiltImage, rootfs: Path, img_config: dict[str, Any]
) -> None:
    cfg = driver_config("img.pmem-csi.intel.com", "img", f"localhost/x@{built.digest}")
    (dep,) = [o for o in bundle.reporter_objects(cfg) if o["kind"] == "Deployment"]
    run_as = oci_pod.pod_spec(dep)["securityContext"]["runAsUser"]
    # A non-root user matching the pod's runAsUser, known to the image's passwd.
    assert img_config["User"] == f"{run_as}:{run_as}"
    passwd = (rootfs / "etc/passwd").read_text().splitlines()
    assert (
        f"reporter:x:{run_as}:{run_as}:pmem-csi reporter:/nonexistent:/usr/sbin/nologin" in passwd
    )
    # The reporter and the pmem_components modules it imports; no Pulumi SDK, no config model.
    site = rootfs / image_tool.SITE_PACKAGES
    assert (site / "reporter/__main__.py").is_file()
    assert (site / "pmem_components/certs.py").is_file()
    assert not (site / "pmem_components/config.py").exists()
    assert not list(site.glob("pulumi*"))
    assert not (site / "kubernetes/aio").exists() and not list(site.glob("aiohttp*"))
    # No compiler, no package installer, no shell.
    for tool in ("gcc", "cc", "c++", "ld", "as", "pip", "pip3", "sh", "bash"):
        for bindir in ("usr/bin", "bin", "usr/local/bin"):
            assert not (rootfs / bindir / tool).exists(), f"/{bindir}/{tool} in the image"
    # Exactly the pinned Debian packages, recorded for image scanners.
    status = (rootfs / "var/lib/dpkg/status").read_text()
    installed = dict(
        (block.split("\n")[0].removeprefix("Package: "), _field(block, "Version"))
        for block in status.strip().split("\n\n")
    )
    assert installed == image_tool.read_packages_lock()
    # The archive skopeo pushes is the same image as the layout.
    out = subprocess.run(
        ["skopeo", "inspect", f"oci-archive:{built.archive}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out)["Digest"] == built.digest


def _field(block: str, name: str) -> str:
    for line in block.splitlines():
        if line.startswith(f"{name}: "):
            return line.split(": ", 1)[1]
    return ""


def test_two_builds_from_the_same_inputs_give_the_same_digest(
    built: image_tool.BuiltImage, tmp_path: Path
) -> None:
    """A second build from scratch (fresh mmdebstrap, pip, tar, umoci), as a clean clone does.

    It runs from a copy of the checkout at another path, with the virtualenv reached through
    another path too: CI builds in a fresh clone, and a host path that leaks into the image
    (an interpreter line, a RECORD hash) changes the digest only there.
    """
    checkout = tmp_path / "clone"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=image_tool.PROJECT_DIR, check=True, capture_output=True
    ).stdout.decode().split("\0")
    for rel in filter(None, tracked):
        src = image_tool.PROJECT_DIR / rel
        if src.is_file():
            (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, checkout / rel)
    venv = tmp_path / "venv"
    venv.symlink_to(Path(sys.prefix))
    cache = tmp_path / "cache"
    cache.mkdir()
    # Wheels are downloaded by hash into the shared cache; no need to fetch them twice.
    (cache / "wheels").symlink_to(image_tool.cache_root() / "wheels")
    subprocess.run(
        [venv / "bin/python", "-m", "tools.image", "build", "--force"],
        cwd=checkout,
        env={**os.environ, "PMEM_CSI_IMAGE_CACHE": str(cache)},
        check=True,
    )
    again = image_tool.BuiltImage(cache / built.dir.name)
    assert again.digest == built.digest
    assert again.archive.read_bytes() == built.archive.read_bytes()


# --------------------------------------------------------------------------- run as a pod


def test_the_runtime_spec_follows_the_deployment_dict_and_refuses_what_it_cannot_run(
    built: image_tool.BuiltImage, img_config: dict[str, Any], tmp_path: Path
) -> None:
    """Change the builder's Deployment and the runtime spec changes with it: no copies."""
    cfg = driver_config("spec.pmem-csi.intel.com", "spec", f"localhost/x@{built.digest}")
    (dep,) = [o for o in bundle.reporter_objects(cfg) if o["kind"] == "Deployment"]
    endpoint = oci_pod.ApiEndpoint("127.0.0.1", 6443, b"")
    sa_dirs: list[tuple[str, str, int]] = []

    def sa_volume(sa: str, namespace: str, uid: int) -> Path:
        sa_dirs.append((sa, namespace, uid))
        return tmp_path / "sa"

    def spec_of(d: dict[str, Any]) -> oci_pod.PodRun:
        return oci_pod.build_runtime_spec(
            d, CONTAINER, img_config, tmp_path / "rootfs", "p", endpoint, sa_volume, tmp_path
        )

    run = spec_of(dep)
    ctr = oci_pod.container_of(dep, CONTAINER)
    assert run.spec["process"]["args"] == [*img_config["Entrypoint"], *ctr["args"]]
    run_as = oci_pod.pod_spec(dep)["securityContext"]["runAsUser"]
    assert sa_dirs == [(cfg.names.reporter, cfg.namespace, run_as)]
    changed = copy.deepcopy(dep)
    c2 = oci_pod.container_of(changed, CONTAINER)
    c2["args"] = [*c2["args"], "--resync-seconds", "7"]
    c2["resources"]["limits"]["memory"] = "300Mi"
    c2["securityContext"]["readOnlyRootFilesystem"] = False
    c2["env"] = [{"name": "X", "value": "1"}]
    oci_pod.pod_spec(changed)["securityContext"]["runAsUser"] = 4242
    run2 = spec_of(changed)
    assert run2.spec["process"]["args"][-2:] == ["--resync-seconds", "7"]
    assert run2.spec["linux"]["resources"]["memory"]["limit"] == 300 * 2**20
    assert run2.spec["root"]["readonly"] is False
    assert "X=1" in run2.spec["process"]["env"]
    assert run2.spec["process"]["user"]["uid"] == 4242
    for where, key in ((oci_pod.pod_spec(changed), "hostPID"), (c2, "lifecycle")):
        where[key] = True
        with pytest.raises(oci_pod.Unsupported, match=key):
            spec_of(changed)
        del where[key]


@pytest.fixture(scope="module")
def driver(raw: RawApi, built: image_tool.BuiltImage) -> Iterator[Driver]:
    ensure_crd(raw)
    suffix = uuid.uuid4().hex[:6]
    # The Deployment names the image by digest: what runs below is exactly that image.
    cfg = driver_config(
        f"img-{suffix}.pmem-csi.intel.com",
        f"img-{suffix}",
        reporter_image=f"localhost/pmem-csi-reporter@{built.digest}",
    )
    drv = deploy_driver(raw, cfg, certs_mod.generate_driver_certificates())
    try:
        yield drv
    finally:
        drv.delete()


@pytest.fixture(scope="module")
def deployment(driver: Driver) -> dict[str, Any]:
    """The reporter's Deployment exactly as the program registers it."""
    (dep,) = [o for o in bundle.reporter_objects(driver.cfg) if o["kind"] == "Deployment"]
    return dep


class Pods:
    """Starts pods of the reporter Deployment under runc; stops all at the end."""

    def __init__(
        self,
        built: image_tool.BuiltImage,
        deployment: dict[str, Any],
        img: dict[str, Any],
        rootfs: Path,
        api_client: Any,
        kubeconfig: Path,
        work: Path,
    ) -> None:
        self.deployment = deployment
        self.img = img
        self.rootfs = rootfs
        self.api_client = api_client
        self.endpoint = oci_pod.api_endpoint(kubeconfig)
        self.work = work
        self.started: list[oci_pod.RuncContainer] = []
        image_ref = oci_pod.container_of(deployment, CONTAINER)["image"]
        assert image_ref.endswith(f"@{built.digest}"), (image_ref, built.digest)

    def start(self) -> oci_pod.RuncContainer:
        pod_name = f"{self.deployment['metadata']['name']}-{uuid.uuid4().hex[:10]}"
        work = self.work / pod_name

        def sa_volume(sa: str, namespace: str, uid: int) -> Path:
            return oci_pod.write_service_account_volume(
                self.api_client, self.endpoint, sa, namespace, work / "serviceaccount", uid
            )

        run = oci_pod.build_runtime_spec(
            self.deployment, CONTAINER, self.img, self.rootfs, pod_name, self.endpoint,
            sa_volume, work,
        )  # fmt: skip
        ctr = oci_pod.RuncContainer(run, work / "bundle", self.work / "runc-state")
        self.started.append(ctr)
        return ctr

    def stop_all(self) -> None:
        for ctr in self.started:
            ctr.stop()
        for ctr in self.started:
            print(f"===== pod {ctr.id} log =====\n{ctr.log()[-20000:]}")


@pytest.fixture(scope="module")
def pods(
    built: image_tool.BuiltImage,
    deployment: dict[str, Any],
    img_config: dict[str, Any],
    rootfs: Path,
    api_client: Any,
    local_cluster: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pods]:
    p = Pods(
        built, deployment, img_config, rootfs, api_client, local_cluster,
        tmp_path_factory.mktemp("pods"),
    )  # fmt: skip
    try:
        yield p
    finally:
        p.stop_all()


@pytest.fixture(scope="module")
def first_pod(pods: Pods) -> oci_pod.RuncContainer:
    return pods.start()


def _still_running(pod: oci_pod.RuncContainer) -> dict[str, Any]:
    """Nothing to report while the pod runs; a dead pod ends the wait with its log."""
    if not pod.alive():
        raise RuntimeError(f"pod {pod.id} exited; log:\n{pod.log()[-5000:]}")
    return {}


def _all_true(driver: Driver) -> dict[str, Any]:
    """The status once every condition is True and the phase Running; else says what is not."""
    status = driver.status()
    conds = {c: condition(status, c).get("status") for c in CONDITIONS}
    if status.get("phase") == "Running" and set(conds.values()) == {"True"}:
        return status
    verified = condition(status, "CertsVerified").get("message")
    raise AssertionError(f"phase={status.get('phase')!r} {conds} CertsVerified: {verified!r}")


def test_reporter_in_its_pod_reaches_all_conditions_true_and_serves_its_endpoints(
    driver: Driver, deployment: dict[str, Any], first_pod: oci_pod.RuncContainer
) -> None:
    pod = first_pod
    status = wait_for(
        lambda: _still_running(pod) or _all_true(driver),
        STATUS_TIMEOUT,
        "all conditions True, phase Running (from the reporter in runc)",
    )
    assert component(status, "Controller")["status"] == "Ready"
    assert component(status, "Node")["status"] == "Ready"
    # The probes' paths on the pod's named port, and /metrics on the same port.
    assert set(pod.run.probes) == {"livenessProbe", "readinessProbe"}
    for probe in pod.run.probes.values():
        path, _, port = probe.partition("@")
        assert int(port) == pod.run.ports["metrics"]
        assert pod.get(path, "metrics")[0] == 200, probe
    code, metrics = pod.get("/metrics", "metrics")
    assert code == 200 and "pmem_csi_reporter_is_leader 1.0" in metrics
    assert "pmem_csi_reporter_status_writes_total" in metrics


def test_the_pod_runs_with_the_deployments_user_read_only_root_memory_limit_and_no_kubeconfig(
    deployment: dict[str, Any], first_pod: oci_pod.RuncContainer
) -> None:
    pod, ctr = first_pod, oci_pod.container_of(deployment, CONTAINER)
    psc = oci_pod.pod_spec(deployment)["securityContext"]
    pid = pod.pid()
    assert pid, pod.log()
    proc_status = Path(f"/proc/{pid}/status").read_text()
    assert set(map(int, _proc_field(proc_status, "Uid"))) == {psc["runAsUser"]}
    assert set(map(int, _proc_field(proc_status, "Gid"))) == {psc["runAsGroup"]}
    # capabilities: drop: [ALL] leaves an empty bounding set.
    assert _proc_field(proc_status, "CapBnd") == ["0" * 16]
    assert _proc_field(proc_status, "NoNewPrivs") == ["1"]
    # seccompProfile: RuntimeDefault: a syscall filter is installed (mode 2).
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert _proc_field(proc_status, "Seccomp") == ["2"]
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
        s.encode() for s in (*pod.run.spec["process"]["args"],)
    ]
    assert pod.run.spec["process"]["args"][-len(ctr["args"]) :] == ctr["args"]
    assert "--kubeconfig" not in ctr["args"]
    raw_env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(item.split(b"=", 1) for item in raw_env if item)
    assert b"KUBECONFIG" not in environ and b"KUBERNETES_SERVICE_HOST" in environ
    # The read-only root (and the read-only token volume) is enforced: EROFS, not EACCES.
    paths = ["/x", "/etc/x", f"{oci_pod.SA_DIR}/x"]
    probe = pod.exec(
        image_tool.PYTHON, "-c",
        f"import errno\nfor p in {paths!r}:\n"
        "    try: open(p, 'w')\n    except OSError as e: print(errno.errorcode[e.errno])\n"
        "    else: print('WRITABLE')",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert probe.stdout.split() == ["EROFS"] * len(paths)
    # Its own network namespace; the API server reached through the forwarder into it.
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert pod.forwarder is not None and pod.forwarder.connections >= 1
    limit = int(oci_pod.quantity(ctr["resources"]["limits"]["memory"]))
    assert oci_pod.memory_limit_of(pid) == limit


def _proc_field(status: str, name: str) -> list[str]:
    (line,) = [x for x in status.splitlines() if x.startswith(f"{name}:")]
    return line.split()[1:]


def _holder(raw: RawApi, driver: Driver) -> str:
    lease = raw.get(LEASE, driver.names.reporter, driver.namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_a_second_pod_takes_the_lease_when_the_first_is_killed_and_reports_changes(
    driver: Driver, raw: RawApi, pods: Pods, first_pod: oci_pod.RuncContainer
) -> None:
    # The reporter's identity is <hostname>_<pid>; the pod's hostname is its name.
    wait_for(lambda: _holder(raw, driver).startswith(f"{first_pod.id}_"), 60, "first pod leads")
    first_pod.kill()
    assert not first_pod.alive()
    second = pods.start()
    wait_for(
        lambda: _holder(raw, driver).startswith(f"{second.id}_"),
        TAKEOVER_TIMEOUT,
        "the second pod holding the Lease",
    )
    wait_for(lambda: second.get("/readyz", "metrics")[0] == 200, 30, "second pod ready")
    # The new leader writes: a change made now shows up in the status.
    delete_object(raw, SERVICE, driver.names.metrics_service, driver.namespace)

    def deployed_false() -> dict[str, Any]:
        cond = condition(driver.status(), "DriverDeployed")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(deployed_false, STATUS_TIMEOUT, "DriverDeployed False from the new leader")
    assert f"Service/{driver.names.metrics_service}" in cond["message"], cond
    assert "pmem_csi_reporter_is_leader 1.0" in second.get("/metrics", "metrics")[1]


def test_the_pod_exits_on_sigterm_within_its_grace_period_and_releases_the_lease(
    driver: Driver, raw: RawApi, pods: Pods
) -> None:
    """What a kubelet does on pod deletion: SIGTERM, and SIGKILL once the grace period is over."""
    (leader,) = [p for p in pods.started if p.alive()]
    assert _holder(raw, driver).startswith(f"{leader.id}_")
    assert leader.stop(), (
        f"the reporter did not exit within terminationGracePeriodSeconds "
        f"({leader.run.grace_seconds:.0f} s) of SIGTERM and was killed; "
        f"log:\n{leader.log()[-3000:]}"
    )
    assert _holder(raw, driver) == ""

"""Certificate renewal and CA change on a running stack, without an outage (issue 15, item 6).

The real engine and provider against the local cluster. One stack goes through what its
administrator does over its life: an existing stack picks up the project's
``kubernetes:enableSecretMutable``, renews its leaves (same CA), then changes its CA on request
(``rotation``), which takes three ``pulumi up`` runs. Throughout:

* a watch on the namespace's Secrets proves they are only ever modified (never deleted or
  re-created: same uid);
* the node DaemonSet rolls by ``OnDelete`` (a patch) and the test deletes one node's pod
  at a time, so pods of two generations coexist, held half-way for as long as the test
  likes; every generation's material is recorded (by the fingerprint in the pod template)
  from the live Secrets, and mutual TLS between the material of every pair of coexisting
  pods is checked with the real keys and certificates (``tests/unit/tlspeers.py``);
* a ``pulumi up`` while a rollout is held does not take the next stage.

kwok's pods run no code, so the handshakes run in the test with the material those pods
mounted; which material a pod has is known from its template's fingerprint.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client, watch

from pmem_components import cert_resource, names
from pmem_components.config import DeploymentConfig, load_config
from pmem_components.manifests import bundle
from tests.e2e.test_program import (
    SECRET_SIG,
    Cluster,
    _write_config,
    assert_keys_not_in_plaintext,
    dispose,
    make_stack,
    resource_changes,
    secret_data,
    up,
)
from tests.e2e.waiting import wait_for
from tests.unit.tlspeers import Generation, links

pytestmark = pytest.mark.timeout(1500)

ON_DELETE = {"kind": "DaemonSet", "mergePatch": {"spec": {"updateStrategy": {"type": "OnDelete"}}}}


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Cluster:
    return Cluster(api_client)


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("certs")


class SecretWatch:
    """Every event on the Secrets of one namespace, in the API server's order."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.events: list[tuple[str, str, str]] = []  # (type, name, uid)
        self.error: Exception | None = None
        self.stopped = False
        listed = core.list_namespaced_secret(namespace)
        self._rv = listed.metadata.resource_version
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stopped:
            try:
                for event in self._watch.stream(
                    self.core.list_namespaced_secret,
                    self.namespace,
                    resource_version=self._rv,
                    timeout_seconds=120,
                ):
                    obj = event["object"]
                    self._rv = obj.metadata.resource_version
                    self.events.append((event["type"], obj.metadata.name, obj.metadata.uid))
            except Exception as err:  # a watch that broke would hide events
                if not self.stopped:
                    self.error = err
                return

    def stop(self) -> None:
        self.stopped = True
        self._watch.stop()


def _cfg(raw: dict[str, Any]) -> DeploymentConfig:
    return load_config({"deployments": [raw]}, check_certificates=False).deployments[0]


def _project_file(stack: Any) -> Path:
    return Path(stack.workspace.work_dir) / "Pulumi.yaml"


class Driver:
    """The live driver of one deployment: Secrets, pods and their material by generation."""

    def __init__(self, core: client.CoreV1Api, kube: Cluster, cfg: DeploymentConfig) -> None:
        self.core, self.kube, self.cfg = core, kube, cfg
        self.material: dict[str, Generation] = {}  # fingerprint -> what its pods mounted

    def secrets(self) -> tuple[dict[str, str], dict[str, str]]:
        n, ns = self.cfg.names, self.cfg.namespace
        return secret_data(self.core, n.registry_secret, ns), secret_data(
            self.core, n.node_secret, ns
        )

    def uids(self) -> dict[str, str]:
        n, ns = self.cfg.names, self.cfg.namespace
        return {
            s: self.core.read_namespaced_secret(s, ns).metadata.uid
            for s in (n.registry_secret, n.node_secret)
        }

    def template_fingerprint(self) -> str:
        ds = self.kube.get(bundle.build_deployment_objects(self.cfg).node[0])
        assert ds is not None
        annotations = ds["spec"]["template"]["metadata"]["annotations"]
        return str(annotations[bundle.CERTIFICATES_HASH_ANNOTATION])

    def record(self) -> str:
        """The current template's fingerprint, with the Secrets' material it stands for."""
        fp = self.template_fingerprint()
        registry, node = self.secrets()
        assert (
            bundle.certificates_fingerprint(
                registry["ca.crt"], registry["tls.crt"], node["tls.crt"]
            )
            == fp
        ), "the pod template names the material in the Secrets"
        self.material[fp] = Generation.from_secrets(registry, node)
        return fp

    def pods(self) -> list[client.V1Pod]:
        sel = ",".join(f"{k}={v}" for k, v in self.cfg.names.selector_labels().items())
        return [
            p
            for p in self.core.list_namespaced_pod(self.cfg.namespace, label_selector=sel).items
            if any(
                o.name in (self.cfg.names.node_driver, self.cfg.names.controller_driver)
                for o in p.metadata.owner_references or []
            )
        ]

    def running(self) -> dict[str, list[str]]:
        """Fingerprints of the live driver pods: ``controller`` and ``node`` lists."""
        out: dict[str, list[str]] = {"controller": [], "node": []}
        for p in self.pods():
            fp = (p.metadata.annotations or {}).get(bundle.CERTIFICATES_HASH_ANNOTATION, "")
            role = "node" if p.metadata.owner_references[0].kind == "DaemonSet" else "controller"
            out[role].append(fp)
        return out

    def roll_nodes(self, fp: str, count: int | None = None) -> None:
        """Delete ``count`` node pods (all) not running ``fp``; wait for their replacements."""
        old = [
            p
            for p in self.pods()
            if p.metadata.owner_references[0].kind == "DaemonSet"
            and (p.metadata.annotations or {}).get(bundle.CERTIFICATES_HASH_ANNOTATION) != fp
        ]
        total = len(self.running()["node"])
        for p in old[:count]:
            self.core.delete_namespaced_pod(
                p.metadata.name, self.cfg.namespace, grace_period_seconds=0
            )
        want = len(old[:count])

        def done() -> Any:
            r = self.running()
            live = [
                p
                for p in self.pods()
                if p.metadata.owner_references[0].kind == "DaemonSet"
                and p.metadata.deletion_timestamp is None
            ]
            new = sum(1 for x in r["node"] if x == fp)
            return len(live) == total == len(r["node"]) and new >= want and r

        wait_for(done, 120, f"node pods rolled to {fp}")

    def controller_on(self, fp: str) -> None:
        wait_for(lambda: self.running()["controller"] == [fp], 120, f"controller on {fp}")

    def check_coexisting(self, tmp: Path) -> list[str]:
        """Mutual TLS between every pair of live pods' material (each link, both ways)."""
        running = self.running()
        controllers, nodes = set(running["controller"]), set(running["node"])
        failures = []
        for c in controllers:
            for n in nodes:
                failures += [
                    f"controller {c[:8]} / node {n[:8]}: {f}"
                    for f in links(self.material[c], self.material[n], tmp / f"{c}-{n}", both=False)
                ]
        # Node pods of different generations talk only through the controller, but every
        # live generation must also accept every other as a controller would (a restarted
        # controller pod mounts the newest material).
        gens = sorted(controllers | nodes)
        for i, a in enumerate(gens):
            for b in gens[i + 1 :]:
                failures += [
                    f"{a[:8]} / {b[:8]}: {f}"
                    for f in links(self.material[a], self.material[b], tmp / f"x{a}-{b}")
                ]
        return failures


def _cas(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


@pytest.fixture(scope="module")
def scenario(
    pulumi_ready: dict[str, str],
    crd: None,
    stacks_dir: Path,
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The module's one stack: the second test goes on from where the first left it (a
    settled CA change), as the same administrator's next CA change."""
    sfx = uuid.uuid4().hex[:6]
    base = {
        "name": f"r-{sfx}.pmem-csi.example",
        "namespace": f"certs-{sfx}",
        "reporter": {"enabled": False},
        # The DaemonSet rolls only when the test deletes a pod: rollouts held half-way.
        "patches": [ON_DELETE],
        "await": {"enabled": False},
    }
    stack = make_stack(stacks_dir, {})
    try:
        yield stack, base
    finally:
        dispose(stack)


def test_renewal_and_ca_change_keep_the_secrets_and_every_pod_trusting_every_other(
    scenario: tuple[Any, dict[str, Any]],
    api_client: Any,
    kube: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    stack, base = scenario
    core = client.CoreV1Api(api_client)
    cfg = _cfg(base)

    def config(certificates: dict[str, Any]) -> dict[str, Any]:
        return {
            "pmem-csi:manageCrd": False,
            "pmem-csi:retainNamespaces": False,
            "pmem-csi:deployments": [{**base, "certificates": certificates}],
        }

    # An existing stack, made before the project set enableSecretMutable (its default
    # provider has no such input; the environment variable only lets the program run).
    project = yaml.safe_load(_project_file(stack).read_text())
    _project_file(stack).write_text(
        yaml.safe_dump({k: v for k, v in project.items() if k != "config"})
    )
    # Given back also when this test fails half way: the next test runs on this stack.
    request.addfinalizer(lambda: _project_file(stack).write_text(yaml.safe_dump(project)))
    # Inline program: it runs in this process, and the CLI (with the provider) inherits it.
    monkeypatch.setenv("PULUMI_K8S_ENABLE_SECRET_MUTABLE", "true")
    _write_config(stack, config({"validityDays": 10, "renewBeforeDays": 5}))
    assert up(stack, "certs: create").summary.result == "succeeded"
    driver = Driver(core, kube, cfg)
    g0 = driver.record()
    driver.controller_on(g0)
    wait_for(lambda: driver.running()["node"] == [g0] * 3, 120, "three node pods")
    uids = driver.uids()
    secrets_watch = SecretWatch(core, cfg.namespace)
    try:
        # --- renewal: the project's setting arrives, leaves renewed under the same CA ----------
        _project_file(stack).write_text(yaml.safe_dump(project))
        monkeypatch.delenv("PULUMI_K8S_ENABLE_SECRET_MUTABLE")
        _write_config(stack, config({"validityDays": 40, "renewBeforeDays": 20}))
        result = up(stack, "certs: renew")
        assert result.summary.result == "succeeded"
        changes = resource_changes(result.summary)
        assert set(changes) <= {"same", "update"}, changes  # nothing replaced or deleted
        g1 = driver.record()
        assert g1 != g0
        (reg0, node0), (reg1, node1) = (
            (driver.material[g].registry, driver.material[g].node) for g in (g0, g1)
        )
        assert reg1.ca == reg0.ca and node1.ca == node0.ca, "same CA: ca.crt unchanged"
        assert reg1.cert != reg0.cert and node1.key != node0.key
        driver.controller_on(g1)
        assert driver.running()["node"] == [g0] * 3  # held: no node pod rolled yet
        assert driver.check_coexisting(tmp_path / "renew") == []
        driver.roll_nodes(g1, 1)
        assert sorted(driver.running()["node"]) == sorted([g1, g0, g0])
        assert driver.check_coexisting(tmp_path / "renew-half") == []
        driver.roll_nodes(g1)

        # --- CA change, stage 1: trust bundle, leaves unchanged --------------------------------
        rotating = config({"validityDays": 40, "renewBeforeDays": 20, "rotation": "2026-12"})
        _write_config(stack, rotating)
        result = up(stack, "certs: rotate (trust)")
        assert set(resource_changes(result.summary)) <= {"same", "update"}
        g2 = driver.record()
        trust = driver.material[g2]
        assert len(_cas(trust.registry.ca)) == 2 and len(_cas(trust.node.ca)) == 2
        assert _cas(trust.registry.ca)[0] == _cas(reg1.ca)[0]
        assert trust.registry.cert == reg1.cert and trust.node.cert == node1.cert
        driver.controller_on(g2)
        driver.roll_nodes(g2, 1)
        assert sorted(driver.running()["node"]) == sorted([g2, g1, g1])
        assert driver.check_coexisting(tmp_path / "trust-half") == []
        # Held half-way, a pulumi up does not take the next stage.
        result = up(stack, "certs: rotate, rollout held")
        assert set(resource_changes(result.summary)) == {"same"}
        assert driver.template_fingerprint() == g2
        driver.roll_nodes(g2)

        # --- stage 2: new leaves from the new CA ------------------------------------------------
        result = up(stack, "certs: rotate (switch)")
        assert set(resource_changes(result.summary)) <= {"same", "update"}
        g3 = driver.record()
        switched = driver.material[g3]
        assert switched.registry.ca == trust.registry.ca  # the bundle stays
        new_ca = _cas(trust.registry.ca)[1]
        for pem in (switched.registry.cert, switched.node.cert):
            x509.load_pem_x509_certificate(pem.encode()).verify_directly_issued_by(new_ca)
        driver.controller_on(g3)
        driver.roll_nodes(g3, 2)
        assert sorted(driver.running()["node"]) == sorted([g3, g3, g2])
        assert driver.check_coexisting(tmp_path / "switch-half") == []
        result = up(stack, "certs: switch, rollout held")
        assert set(resource_changes(result.summary)) == {"same"}
        driver.roll_nodes(g3)

        # --- stage 3: the old CA leaves the bundle ----------------------------------------------
        result = up(stack, "certs: rotate (settle)")
        assert set(resource_changes(result.summary)) <= {"same", "update"}
        g4 = driver.record()
        settled = driver.material[g4]
        assert _cas(settled.registry.ca) == [new_ca] == _cas(settled.node.ca)
        assert settled.registry.cert == switched.registry.cert
        driver.controller_on(g4)
        driver.roll_nodes(g4, 1)
        assert driver.check_coexisting(tmp_path / "settle-half") == []
        driver.roll_nodes(g4)
        result = up(stack, "certs: done")
        assert set(resource_changes(result.summary)) == {"same"}
        # Pods two stages apart would not have trusted each other: why each stage waits.
        assert links(driver.material[g1], driver.material[g3], tmp_path / "apart")
    finally:
        secrets_watch.stop()
    assert secrets_watch.error is None, secrets_watch.error
    ours = set(uids)
    seen = [(t, n, u) for t, n, u in secrets_watch.events if n in ours]
    assert seen, "the watch saw the Secret updates"
    assert {t for t, _, _ in seen} == {"MODIFIED"}, seen  # never DELETED, never ADDED again
    assert {n: u for _, n, u in seen} == uids
    assert driver.uids() == uids

    # No private key in plaintext in the state, the CA's included.
    registry, node = driver.secrets()
    assert_keys_not_in_plaintext(stack, [registry["tls.key"], node["tls.key"]])
    exported = stack.export_stack().deployment
    (dyn,) = [
        r
        for r in exported["resources"]
        if r["type"] == "pulumi-python:dynamic/pmem-csi:Certificates"
    ]
    assert SECRET_SIG in dyn["outputs"][cert_resource.ISSUER_KEY]
    assert "PRIVATE KEY" not in str(
        {k: v for k, v in dyn["outputs"].items() if not isinstance(v, dict)}
    )
    assert names.CRD_KIND  # the module's imports stay used


def test_with_the_preflight_off_a_ca_change_advances_on_the_confirmed_hash(
    scenario: tuple[Any, dict[str, Any]],
    api_client: Any,
    kube: Cluster,
) -> None:
    """Without the preflight the program cannot see the pods: stage 1 of a CA change tells
    the administrator the stage's hash and the setting that confirms it, waits without it,
    takes the next stage with it, and a confirmation left in the config moves nothing more.

    Goes on from the first test's stack (its CA change settled, every pod on its last
    material): the next CA change, with the preflight off and the ``OnDelete`` patch dropped
    in the same update (an ordinary rollout)."""
    stack, base = scenario
    if not stack.export_stack().deployment.get("resources"):
        pytest.fail(
            "this test goes on from the stack the module's first test leaves (a settled CA "
            "change), which holds nothing: run the module whole, and see the first test first",
            pytrace=False,
        )
    base = {k: v for k, v in base.items() if k != "patches"}  # an ordinary rollout
    cfg = _cfg(base)
    driver = Driver(client.CoreV1Api(api_client), kube, cfg)

    def config(**certificates: Any) -> dict[str, Any]:
        lifetime = {"validityDays": 40, "renewBeforeDays": 20}  # the first test's
        return {
            "pmem-csi:manageCrd": False,
            "pmem-csi:retainNamespaces": False,
            "pmem-csi:preflight": False,
            "pmem-csi:deployments": [{**base, "certificates": {**lifetime, **certificates}}],
        }

    g0 = driver.record()
    assert set(driver.running()["node"]) == {g0}, "settled: every node pod on the last stage"
    _write_config(stack, config(rotation="r2"))
    result = up(stack, "preflight off: rotate (trust)")
    g1 = driver.record()
    assert len(_cas(driver.material[g1].registry.ca)) == 2, "stage 1: the trust bundle"
    assert g1 != g0
    key = "pmem-csi:deployments[0].certificates.rolledOut"
    assert "pmem-csi:preflight is off" in result.stdout and f"'{key}' {g1}" in result.stdout

    # Confirmed: the next stage. The pods run it (kwok rolls them at once; checked, so the
    # test confirms only what is true).
    driver.controller_on(g1)
    wait_for(lambda: set(driver.running()["node"]) == {g1}, 120, "node pods on stage 1")
    _write_config(stack, config(rotation="r2", rolledOut=g1))
    result = up(stack, "preflight off: confirmed (switch)")
    assert set(resource_changes(result.summary)) <= {"same", "update"}
    g2 = driver.record()
    new_ca = _cas(driver.material[g1].registry.ca)[1]
    x509.load_pem_x509_certificate(
        driver.material[g2].registry.cert.encode()
    ).verify_directly_issued_by(new_ca)
    # The confirmation still names stage 1's hash: stage 2 waits.
    result = up(stack, "preflight off: stale confirmation")
    assert set(resource_changes(result.summary)) == {"same"}
    assert driver.template_fingerprint() == g2
    assert f"'{key}' {g2}" in result.stdout

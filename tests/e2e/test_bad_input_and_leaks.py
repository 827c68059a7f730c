"""Bad input and key material, end to end: the real engine and provider, the local cluster.

* A bad config fails ``pulumi up`` with one message naming the key, and nothing reaches the
  cluster (``test_bad_configs_fail_naming_the_key_and_create_nothing``).
* A patch value of the wrong type, stored by ``pulumi config set --path`` (an all-digit
  nodeSelector value becomes a number: CI's red run), fails ``pulumi up`` naming the key and
  the fix, with nothing created; and the program's type check agrees with the API server on
  what it refuses and accepts (``test_the_type_check_agrees_with_the_api_server``).
* On a running stack, a patch that would change a workload's (immutable) selector fails the
  same way and changes nothing.
* No private key leaks (issue 10, item 7): after one ``pulumi up`` of a stack with one
  deployment on generated and one on provided certificates, neither the plain
  ``pulumi stack export``, the decrypted export (outside secret values), the backend files,
  the engine output (``--debug --diff``, its log at ``-v=8``), the reporter's DEBUG log,
  the CRs (spec and status) nor any Event contains a private key -- searched by the key's
  actual bytes (PEM lines, base64 of the PEM) and by ``PRIVATE KEY``.
* The reporter, run as ``tests/e2e/test_reporter.py`` runs it, overwrites a status that
  another writer filled with garbage, and leaves nothing of the garbage behind. It yields to
  that other writer for ``--conflict-quiet-seconds`` first (docs/reporter.md); the module's
  reporter runs with a quiet period of :data:`CONFLICT_QUIET` s instead of the default minute,
  and a message interval of 1 s (so its writes settle in 4 s, not 20): the overwrite is the
  same code path, only the wait is shorter.

Economy: one stack that every ``pulumi up`` of it refuses serves the bad-config tests, one
deployed stack (two deployments) the tests after them; both are destroyed at the end of the
module.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import certs as certlib
from pmem_components import names, patchtypes
from pmem_components import preflight as pf
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import controller
from pmem_components.patches import merge_patch
from reporter import status as st
from reporter.kubeapi import RawApi
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    component,
    condition,
    ensure_crd,
    token_kubeconfig,
)
from tests.e2e.test_program import (
    Cluster,
    dispose,
    leftovers,
    make_stack,
    parsed,
    pem_body,
    stack_config,
    unique_deployment,
    unmarked_paths,
)
from tests.e2e.waiting import wait_for
from tools import localenv, toolchain
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

STATUS_TIMEOUT = 90.0
PRIVATE_MARKER = "PRIVATE KEY"
WRITES = "pmem_csi_reporter_status_writes_total"
CONFLICTS = "pmem_csi_reporter_status_conflicts_total"
# The module reporter's --conflict-quiet-seconds (the default is 60).
CONFLICT_QUIET = 3.0


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Cluster:
    return Cluster(api_client)


@pytest.fixture(scope="module")
def crd(api_client: Any) -> None:
    ensure_crd(RawApi(api_client))


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input-stacks")


@pytest.fixture(scope="module")
def refused_stack(
    pulumi_ready: dict[str, str], crd: None, stacks_dir: Path
) -> Iterator[auto.Stack]:
    """One stack for the bad-config tests, each of which writes its own config first: every
    ``pulumi up`` of it is refused, so it never holds a resource (each test asserts that),
    and one stack made and destroyed serves them all."""
    stack = make_stack(stacks_dir, stack_config())
    try:
        yield stack
    finally:
        dispose(stack)


def _still_empty(stack: auto.Stack) -> auto.Stack:
    """The shared refused stack, checked to hold nothing before a test uses it: an earlier
    test whose bad config was let through would otherwise fail this test for its objects."""
    resources = stack.export_stack().deployment.get("resources") or []
    held = [r["urn"] for r in resources if r["type"] != "pulumi:pulumi:Stack"]
    assert not held, (
        "the shared refused stack holds resources: an earlier test's bad config was deployed "
        f"({held[:5]})"
    )
    return stack


def _expect_up_error(stack: auto.Stack, key: str) -> str:
    """``pulumi up`` fails; every error line is the one config problem, naming ``key``."""
    with pytest.raises(auto.CommandError) as err:
        stack.up(on_output=ps.printer("[bad up] "))
    text = str(err.value)
    errors = [line for line in text.splitlines() if line.strip().startswith("error:")]
    assert errors, text
    for line in errors:
        assert "invalid stack configuration (1 problem(s))" in line or key in line, text
    assert key in text, text
    return text


# --------------------------------------------------------------------------- bad configs


def test_bad_configs_fail_naming_the_key_and_create_nothing(
    refused_stack: auto.Stack, kube: Cluster
) -> None:
    """Three kinds of bad input in turn (a value, a certificate, a patch) on one stack."""
    now = dt.datetime.now(dt.UTC)
    expired = certlib.generate_ca(now=now - dt.timedelta(days=400))
    # Leaves valid today, so that the CA's expiry is the one thing wrong.
    leaves = {
        name: certlib.generate_leaf(
            expired,
            name,
            not_before=now - dt.timedelta(days=1),
            not_after=now + dt.timedelta(days=300),
        )
        for name in (certlib.REGISTRY_NAME, certlib.NODE_CONTROLLER_NAME)
    }
    good = certlib.DriverCertificates(
        ca_cert=expired.cert_pem,
        ca_key="",
        registry_cert=leaves[certlib.REGISTRY_NAME].cert_pem,
        registry_key=leaves[certlib.REGISTRY_NAME].key_pem,
        node_controller_cert=leaves[certlib.NODE_CONTROLLER_NAME].cert_pem,
        node_controller_key=leaves[certlib.NODE_CONTROLLER_NAME].key_pem,
    )
    raw = unique_deployment()
    cases: list[tuple[dict[str, Any], dict[str, str], str]] = [
        ({**raw, "reporter": {"replicas": "two"}}, {}, "pmem-csi:deployments[0].reporter.replicas"),
        (
            {
                **raw,
                "certificates": {
                    "caCert": good.ca_cert,
                    "registryCert": good.registry_cert,
                    "nodeControllerCert": good.node_controller_cert,
                },
            },
            _secret_keys(0, good),
            "pmem-csi:deployments[0].certificates.caCert",
        ),
        (
            {
                **raw,
                "patches": [
                    {
                        "kind": "DaemonSet",
                        "mergePatch": {"spec": {"selector": {"matchLabels": {"a": "b"}}}},
                    }
                ],
            },
            {},
            "pmem-csi:deployments[0].patches[0]",
        ),
    ]
    stack = _still_empty(refused_stack)
    for dep, secrets, key in cases:
        ps.write_stack_config(Path(stack.workspace.work_dir), stack.name, stack_config(dep))
        for path, value in secrets.items():
            stack.set_config(path, auto.ConfigValue(value=value, secret=True), path=True)
        text = _expect_up_error(stack, key)
        for secret in secrets.values():
            assert pem_body(secret)[:64] not in text
    assert leftovers(kube, DeploymentConfig(name=raw["name"], namespace=raw["namespace"])) == []
    resources = stack.export_stack().deployment.get("resources") or []
    assert [r["type"] for r in resources if r["type"] != "pulumi:pulumi:Stack"] == []


def test_a_number_for_a_string_in_a_patch_fails_up_and_creates_nothing(
    refused_stack: auto.Stack, kube: Cluster
) -> None:
    """CI's red run, as it happened: ``config set --path ... 253578`` stores a number."""
    raw = unique_deployment(patches=[{"kind": "StatefulSet"}])
    key = (
        "pmem-csi:deployments[0].patches[0].mergePatch.spec.template.spec.nodeSelector"
        ".interrupt-gate"
    )
    stack = _still_empty(refused_stack)
    ps.write_stack_config(Path(stack.workspace.work_dir), stack.name, stack_config(raw))
    stack.set_config(key, auto.ConfigValue(value="253578"), path=True)
    stored = stack.get_config("pmem-csi:deployments", path=False).value
    assert '"interrupt-gate":253578' in stored.replace(" ", ""), stored  # a number
    text = _expect_up_error(stack, key)
    assert "must be a string, not the number 253578" in text, text
    assert f"pulumi config set --type string --path '{key}' -- 253578" in text, text
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": raw["namespace"]}}
    assert kube.get(ns) is None
    assert leftovers(kube, DeploymentConfig(name=raw["name"], namespace=raw["namespace"])) == []
    resources = stack.export_stack().deployment.get("resources") or []
    assert [r["type"] for r in resources if r["type"] != "pulumi:pulumi:Stack"] == []
    # The fix the message gives works, run as given (--type string, and "--" before the
    # value): the preview passes the checks.
    suggested = shlex.split(text.split("pulumi config set ", 1)[1].splitlines()[0])
    assert suggested == ["--type", "string", "--path", key, "--", "253578"], suggested
    subprocess.run(
        [str(toolchain.bin_path("pulumi")), "config", "set", "--stack", stack.name,
         *suggested],
        cwd=stack.workspace.work_dir,
        env={**os.environ, **(stack.workspace.env_vars or {})},
        check=True,
        capture_output=True,
        timeout=60,
    )
    stack.preview(on_output=ps.printer("[fixed preview] "))


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": spec}}}


def _driver(**container: Any) -> dict[str, Any]:
    return _pod({"containers": [{"name": "pmem-driver", "image": "x", **container}]})


# (merge patch of the controller StatefulSet, refused by the API server)
AGREEMENT_CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "nodeSelector-number": (_pod({"nodeSelector": {"gate": 253578}}), True),
    "nodeSelector-true": (_pod({"nodeSelector": {"gate": True}}), True),
    "label-number": ({"metadata": {"labels": {"team": 7}}}, True),
    "env-value-number": (_driver(env=[{"name": "N", "value": 3}]), True),
    "replicas-string": ({"spec": {"replicas": "3"}}, True),
    "minReadySeconds-fraction": ({"spec": {"minReadySeconds": 1.5}}, True),
    "hostNetwork-string": (_pod({"hostNetwork": "true"}), True),
    "quantity-garbage": (_driver(resources={"limits": {"cpu": "lots"}}), True),
    "int-or-string-int": ({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0,
                                                                        "maxUnavailable": 1}}}},
                          False),
    "int-or-string-string": ({"spec": {"updateStrategy": {"rollingUpdate": {
        "maxUnavailable": "50%"}}}}, False),
    "quantity-int": (_driver(resources={"limits": {"cpu": 2}}), False),
    "quantity-float": (_driver(resources={"requests": {"cpu": 0.5}}), False),
    "probe-port-int": (_driver(livenessProbe={"tcpSocket": {"port": 8080}}), False),
    "probe-port-name": (_driver(livenessProbe={"tcpSocket": {"port": "metrics"}}), False),
    "merge-null": (_pod({"nodeSelector": {"storage": None}}), False),
    "replicas-integral-float": ({"spec": {"replicas": 2.0}}, False),
}


@pytest.mark.parametrize("case", sorted(AGREEMENT_CASES))
def test_the_type_check_agrees_with_the_api_server(api_client: Any, case: str) -> None:
    """The program refuses exactly the types the API server refuses (server-side apply, dry
    run, as the provider applies): no valid input is refused, no wrong type gets through."""
    patch, refused = AGREEMENT_CASES[case]
    obj = merge_patch(controller.build_controller_statefulset(DeploymentConfig()), patch)
    obj["metadata"]["namespace"] = "default"  # exists; a dry run writes nothing
    path = pf._path("apps/v1", "StatefulSet", "default", obj["metadata"]["name"])
    status, body = pf._Reader(api_client).dry_apply(path, obj, "pulumi-kubernetes")
    assert (status >= 400) == refused, (status, body.get("message"))
    found = patchtypes.mismatches(obj)
    assert bool(found) == refused, found


# --------------------------------------------------------------------------- the deployed pair


def _secret_keys(index: int, certs: certlib.DriverCertificates) -> dict[str, str]:
    prefix = f"pmem-csi:deployments[{index}].certificates"
    return {
        f"{prefix}.registryKey": certs.registry_key,
        f"{prefix}.nodeControllerKey": certs.node_controller_key,
    }


@dataclass
class Pair:
    """One stack, deployment 0 on generated and deployment 1 on provided certificates."""

    stack: auto.Stack
    raws: list[dict[str, Any]]
    cfgs: list[DeploymentConfig]
    provided: certlib.DriverCertificates
    up: auto.UpResult
    reporters: list[ReporterProcess] = field(default_factory=list)


@pytest.fixture(scope="module")
def pair(
    pulumi_ready: dict[str, str],
    crd: None,
    stacks_dir: Path,
    api_client: Any,
    local_cluster: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    provided = certlib.generate_driver_certificates()
    public = {
        "caCert": provided.ca_cert,
        "registryCert": provided.registry_cert,
        "nodeControllerCert": provided.node_controller_cert,
    }
    # The reporter's ServiceAccount and RBAC exist only when it has an image.
    with_reporter = {"reporter": {"image": REPORTER_IMAGE}}
    raws = [
        unique_deployment(**with_reporter),
        unique_deployment(certificates=public, **with_reporter),
    ]
    secrets = _secret_keys(1, provided)
    stack = make_stack(stacks_dir, stack_config(*raws), secrets)
    logs = tmp_path_factory.mktemp("reporter-logs")
    reporters: list[ReporterProcess] = []
    try:
        # The engine's most verbose display a user gets without asking for secrets, plus its
        # own log at -v=8. From -v=9 on the engine logs the raw gRPC payloads it exchanges
        # with providers, secrets in plaintext included (Pulumi's behaviour, measured here:
        # the generated keys appear), so that level is not one to share; see docs/faults.md.
        result = stack.up(
            on_output=ps.printer("[leak up] "),
            debug=True,
            diff=True,
            show_secrets=False,
            log_verbosity=8,
            log_to_std_err=True,
        )
        cfgs = [
            parsed(raws[0]),
            parsed(
                raws[1],
                {
                    "registryKey": provided.registry_key,
                    "nodeControllerKey": provided.node_controller_key,
                },
            ),
        ]
        # The stack's one reporter, serving both deployments as the program deploys it: a
        # subprocess under its ServiceAccount's token (named after the first deployment),
        # log level DEBUG (its most verbose).
        first = cfgs[0]
        kubeconfig = token_kubeconfig(
            api_client, local_cluster, first.names.reporter, first.namespace, logs / "kubeconfig"
        )
        reporters.append(
            ReporterProcess(
                kubeconfig,
                first.name,
                first.namespace,
                "leak-0",
                logs / "reporter-0.log",
                resync_seconds=2.0,
                extra_args=(
                    *(arg for cfg in cfgs[1:] for arg in ("--deployment", cfg.name)),
                    "--shared-watches",
                    "--message-interval",
                    "1",
                    "--conflict-quiet-seconds",
                    str(CONFLICT_QUIET),
                ),
            )
        )
        yield Pair(stack, raws, cfgs, provided, result, reporters)
    finally:
        for proc in reporters:
            proc.stop()
        for proc in reporters:
            print(f"===== reporter {proc.identity} log (tail) =====")
            print(proc.log()[-5000:])
        dispose(stack)
        # The reporter's Events about the cluster-scoped CRs live in "default".
        for raw in raws:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_collection_namespaced_event(
                    names.CLUSTER_EVENT_NAMESPACE,
                    field_selector=f"involvedObject.name={raw['name']}",
                )


def _cr(api_client: Any, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api_client).get_cluster_custom_object(
        names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, name
    )


def _running(api_client: Any, name: str) -> dict[str, Any]:
    status = _cr(api_client, name).get("status") or {}
    return status if status.get("phase") == "Running" else {}


def _secret_text(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, str]:
    secret = core.read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def needles(private_key: str) -> list[str]:
    """Substrings that betray ``private_key`` in any of the encodings it could leak in."""
    body = pem_body(private_key)
    lines = [ln for ln in private_key.strip().splitlines() if not ln.startswith("-----")]
    b64 = base64.b64encode(private_key.encode()).decode()
    return [lines[0], lines[len(lines) // 2], lines[-2], body[:48], b64[:64], b64[400:464]]


def _leaks(text: str, keys: list[str]) -> list[str]:
    found = [f"key {i} ({n[:12]}...)" for i, k in enumerate(keys) for n in needles(k) if n in text]
    if PRIVATE_MARKER in text:
        found.append(PRIVATE_MARKER)
    return found


def _plain_cli_export(stack: auto.Stack) -> str:
    """``pulumi stack export`` as an administrator types it (no --show-secrets)."""
    env = localenv.apply_pulumi_env()
    out = subprocess.run(
        [
            str(toolchain.bin_path("pulumi")),
            "stack",
            "export",
            "--stack",
            stack.name,
            "--cwd",
            stack.workspace.work_dir,
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def _backend_files(stack: auto.Stack) -> dict[str, str]:
    """Every file of the file backend, plus the stack's settings file (encrypted secrets)."""
    roots = [localenv.state_dir() / "pulumi-backend"]
    files = [p for r in roots for p in r.rglob("*") if p.is_file()]
    files.append(Path(stack.workspace.work_dir) / f"Pulumi.{stack.name}.yaml")
    out: dict[str, str] = {}
    for path in files:
        with contextlib.suppress(FileNotFoundError):  # a lock file gone meanwhile
            out[str(path)] = path.read_bytes().decode("utf-8", "replace")
    assert any(stack.name in p for p in out), f"no backend file of {stack.name}"
    return out


def test_no_private_key_in_state_output_logs_crs_or_events(pair: Pair, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    keys: list[str] = []
    for cfg in pair.cfgs:
        for secret in (cfg.names.registry_secret, cfg.names.node_secret):
            data = _secret_text(core, secret, cfg.namespace)
            keys.append(data["tls.key"])
            # The needles are right: they do find the key where it belongs.
            raw_secret = core.read_namespaced_secret(secret, cfg.namespace).data["tls.key"]
            assert _leaks(data["tls.key"], [data["tls.key"]])
            assert needles(data["tls.key"])[4] in raw_secret
    assert pair.provided.registry_key in keys and pair.provided.node_controller_key in keys
    # The reporters have read the Secrets (CertsVerified needs the keys) and written status.
    for cfg in pair.cfgs:
        wait_for(lambda c=cfg: _running(api_client, c.name), STATUS_TIMEOUT, f"{cfg.name} Running")
    assert pair.up.summary.result == "succeeded"

    problems: dict[str, list[str]] = {}
    problems["pulumi stack export"] = _leaks(_plain_cli_export(pair.stack), keys)
    exported = pair.stack.export_stack().deployment
    problems["export --show-secrets outside secret values"] = [
        p for k in keys for n in needles(k)[:3] for p in unmarked_paths(exported, n)
    ]
    for path, text in _backend_files(pair.stack).items():
        problems[f"backend file {path}"] = _leaks(text, keys)
    problems["engine output (up --debug --diff -v=8)"] = _leaks(
        pair.up.stdout + pair.up.stderr, keys
    )
    for proc in pair.reporters:
        proc.metrics()  # its HTTP server logs each request at DEBUG: proof of the level
        log = wait_for(lambda p=proc: "DEBUG" in p.log() and p.log(), 10, "a DEBUG line")
        problems[f"reporter {proc.identity} log"] = _leaks(log, keys)
    for cfg in pair.cfgs:
        cr = _cr(api_client, cfg.name)
        problems[f"CR {cfg.name}"] = _leaks(
            json.dumps({"spec": cr["spec"], "status": cr["status"]}), keys
        )
    events = core.list_event_for_all_namespaces().items
    assert any(e.involved_object.name in {c.name for c in pair.cfgs} for e in events)
    problems["Events"] = _leaks(
        json.dumps([api_client.sanitize_for_serialization(e) for e in events]), keys
    )
    assert {where: found for where, found in problems.items() if found} == {}


# --------------------------------------------------------------------------- garbage status

GARBAGE_STATUS: dict[str, Any] = {
    "phase": "Failed",
    "reason": "garbage written by someone else",
    "observedGeneration": 999,
    "lastUpdated": "2999-01-01T00:00:00Z",
    "conditions": [
        {"type": "Bogus", "status": "Unknown", "reason": "Garbage", "message": "garbage"},
        {
            "type": "CertsReady",
            "status": "True",
            "reason": "Garbage",
            "message": "garbage",
            "lastTransitionTime": "2999-01-01T00:00:00Z",
        },
        {
            "type": "DriverDeployed",
            "status": "True",
            "reason": "Garbage",
            "lastTransitionTime": "1970-01-01T00:00:00Z",
        },
    ],
    "driverComponents": [
        {"component": "Node", "status": "Ready", "reason": "garbage"},
        {"component": "Controller", "status": "NotReady", "lastUpdated": "2999-01-01T00:00:00Z"},
    ],
}


def _times(status: dict[str, Any]) -> list[dt.datetime]:
    stamps = [status.get("lastUpdated")]
    stamps += [c.get("lastTransitionTime") for c in status.get("conditions") or []]
    stamps += [c.get("lastUpdated") for c in status.get("driverComponents") or []]
    return [dt.datetime.fromisoformat(str(s).replace("Z", "+00:00")) for s in stamps]


def test_reporter_overwrites_a_garbage_status_cleanly(pair: Pair, api_client: Any) -> None:
    cfg = pair.cfgs[0]
    reporter = pair.reporters[0]
    clean = wait_for(lambda: _running(api_client, cfg.name), STATUS_TIMEOUT, "Running")
    before = _cr(api_client, cfg.name)
    # The counter goes up after the PATCH that wrote Running returned, possibly after that
    # status was seen, and Pending was written before: wait until neither the counter nor the
    # CR (each status write moves its resourceVersion) changes any more, so every write up to
    # Running is counted and the comparison below counts the overwrite alone.
    writes = reporter.settled_metrics(
        (WRITES,), lambda: _cr(api_client, cfg.name)["metadata"]["resourceVersion"]
    )[WRITES]
    conflicts = reporter.metric(CONFLICTS)
    assert writes >= 1, "the write of Running counted"
    landed = client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        names.CRD_GROUP,
        names.CRD_STORAGE_VERSION,
        names.CRD_PLURAL,
        cfg.name,
        {"status": GARBAGE_STATUS},
        field_manager="garbage-writer",
        _content_type="application/merge-patch+json",
    )
    # It did land: the PATCH's answer is the object as stored (a GET now could already see
    # the reporter's rewrite).
    written = landed["status"]
    assert written["phase"] == "Failed" and len(written["conditions"]) == 3, written

    def clean_again() -> dict[str, Any]:
        status = _cr(api_client, cfg.name).get("status") or {}
        return status if "arbage" not in json.dumps(status) else {}

    start = time.monotonic()
    # Another writer's status: the reporter writes again once it has been left alone for
    # --conflict-quiet-seconds (docs/reporter.md), so that long more.
    status = wait_for(clean_again, STATUS_TIMEOUT + CONFLICT_QUIET, "the garbage overwritten")
    print(f"garbage status overwritten after {time.monotonic() - start:.1f}s")
    wait_for(lambda: reporter.metric(WRITES) > writes, 30, "the reporter's overwrite counted")
    # It saw another writer's status as such (and yielded to it), not as its own, for the
    # configured quiet period (the writer's default would be a minute).
    assert reporter.metric(CONFLICTS) > conflicts
    assert f"only after {CONFLICT_QUIET:g} s without such changes" in reporter.log()
    assert st.status_equal_ignoring_time(status, clean), (status, clean)
    assert [c["type"] for c in status["conditions"]] == list(st.CONDITION_TYPES)
    assert status["observedGeneration"] == before["metadata"]["generation"]
    assert condition(status, "DriverDeployed")["status"] == "True"
    assert component(status, "Controller")["status"] == "Ready"
    created = dt.datetime.fromisoformat(
        before["metadata"]["creationTimestamp"].replace("Z", "+00:00")
    )
    now = dt.datetime.now(dt.UTC)
    skew = dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS)
    for t in _times(status):
        assert created - skew <= t <= now + skew, status
    # Garbage in the timestamps alone (the meaning right) is written over too.
    conditions = json.loads(json.dumps(status["conditions"]))
    conditions[0]["lastTransitionTime"] = "2999-01-01T00:00:00Z"
    landed = client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        names.CRD_GROUP,
        names.CRD_STORAGE_VERSION,
        names.CRD_PLURAL,
        cfg.name,
        {"status": {"conditions": conditions}},
        field_manager="garbage-writer",
        _content_type="application/merge-patch+json",
    )
    assert "2999" in json.dumps(landed["status"]), landed["status"]  # it did land

    def no_future_time() -> dict[str, Any]:
        current = _cr(api_client, cfg.name).get("status") or {}
        return current if "2999" not in json.dumps(current) else {}

    status = wait_for(no_future_time, STATUS_TIMEOUT, "the future timestamp overwritten")
    assert st.status_equal_ignoring_time(status, clean), (status, clean)
    # Nothing lost: the spec is untouched, the other deployment's status too.
    after = _cr(api_client, cfg.name)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    other = pair.cfgs[1].name
    wait_for(lambda: _running(api_client, other), STATUS_TIMEOUT, f"{other} Running")


# --------------------------------------------------------------------------- a running stack


def test_a_selector_patch_on_a_running_stack_fails_and_changes_nothing(
    pair: Pair, api_client: Any
) -> None:
    cfg = pair.cfgs[0]
    apps = client.AppsV1Api(api_client)
    ds_before = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
    resources_before = len(pair.stack.export_stack().deployment["resources"])
    patched = {
        **pair.raws[0],
        "patches": [
            {
                "kind": "DaemonSet",
                "jsonPatch": [
                    {"op": "add", "path": "/spec/selector/matchLabels/tier", "value": "x"},
                    {"op": "add", "path": "/spec/template/metadata/labels/tier", "value": "x"},
                ],
            }
        ],
    }
    ps.write_stack_config(
        Path(pair.stack.workspace.work_dir), pair.stack.name, stack_config(patched, pair.raws[1])
    )
    for path, value in _secret_keys(1, pair.provided).items():
        pair.stack.set_config(path, auto.ConfigValue(value=value, secret=True), path=True)
    try:
        text = _expect_up_error(pair.stack, "pmem-csi:deployments[0].patches[0]")
        assert "spec.selector cannot be patched" in text
        ds_after = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
        assert ds_after.metadata.resource_version == ds_before.metadata.resource_version
        state = pair.stack.export_stack().deployment
        assert len(state["resources"]) == resources_before
        assert not state.get("pending_operations")
        assert _running(api_client, cfg.name)
    finally:
        ps.write_stack_config(
            Path(pair.stack.workspace.work_dir),
            pair.stack.name,
            stack_config(pair.raws[0], pair.raws[1]),
        )
        for path, value in _secret_keys(1, pair.provided).items():
            pair.stack.set_config(path, auto.ConfigValue(value=value, secret=True), path=True)

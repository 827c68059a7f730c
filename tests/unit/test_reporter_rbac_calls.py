"""Grants versus calls: the reporter's RBAC allows every request it makes, and nothing more.

The reporter (observer, writer, leader election) runs against a recording fake of the HTTP
client below the real ``RawApi``, so the requests are the real paths and query strings. Each
is turned into the attributes the API server's RBAC authorizer checks (verb, group, resource,
namespace, name -- for list/watch the name comes from ``fieldSelector=metadata.name=``), then
matched against the rules ``build_reporter_objects`` produces. Unused rules fail the test too:
a grant nobody exercises is a grant too many.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pmem_components.manifests.reporter import build_reporter_objects
from pmem_components.names import DeploymentNames
from reporter.kubeapi import RawApi
from reporter.leader import LeaderElector
from reporter.metrics import Metrics
from reporter.observe import Observer
from reporter.retry import Backoff
from reporter.write import KubeStatusApi, StatusWriter

NAME = "pmem-csi.intel.com"
NAMES = DeploymentNames(NAME)
NS = "drv"


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str
    namespace: str
    name: str


class Response:
    def __init__(self, status: int, body: Any = None) -> None:
        self.status = status
        self.reason = "OK" if status < 300 else "Error"
        self.data = json.dumps(body or {}).encode()
        self.response = self
        self.headers: dict = {}

    def read(self) -> bytes:
        return self.data

    def stream(self, amt=None, decode_content=True):
        return iter(())

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass

    def getheaders(self) -> dict:
        return {}


def parse(method: str, path: str, query: list[tuple[str, Any]]) -> Request:
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource += "/" + rest[2]
    q = dict(query)
    if method == "GET" and not name:
        verb = "watch" if q.get("watch") == "true" else "list"
        selector = str(q.get("fieldSelector") or "")
        if selector.startswith("metadata.name="):
            name = selector.split("=", 1)[1]
    else:
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return Request(verb, group, resource, namespace, name)


class RecordingClient:
    """Stands in for kubernetes.client.ApiClient below RawApi."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.leases: dict[str, dict] = {}
        self.conflicts = 1

    def param_serialize(self, *, method, resource_path, query_params, header_params, body, **_):
        return (method, resource_path, list(query_params), body)

    def call_api(self, method, path, query, body, _request_timeout=None):
        assert _request_timeout is not None, f"{method} {path} without a timeout"
        req = parse(method, path, query)
        self.requests.append(req)
        if req.resource == "deployments" and req.verb in ("list", "get"):
            cr = {
                "apiVersion": "pmem-csi.intel.com/v1beta1",
                "kind": "Deployment",
                "metadata": {"name": NAME, "resourceVersion": "5", "generation": 1},
                "spec": {"namespace": NS},
            }
            if req.verb == "get":
                return Response(200, cr)
            return Response(200, {"items": [cr], "metadata": {"resourceVersion": "5"}})
        if req.verb in ("list", "watch"):
            return Response(200, {"items": [], "metadata": {"resourceVersion": "7"}})
        if req.resource == "deployments/status":
            if self.conflicts:
                self.conflicts -= 1
                return Response(409, {"code": 409})
            return Response(200, {"metadata": {"name": NAME, "resourceVersion": "9"}})
        if req.resource == "leases":
            if req.verb == "get":
                lease = self.leases.get(req.name)
                return Response(200, lease) if lease else Response(404, {"code": 404})
            lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "3"}}
            self.leases[lease["metadata"]["name"]] = lease
            return Response(200, lease)
        if req.resource == "events":
            return Response(201, body)
        if req.verb == "get":  # an absent object looked up by name (relabelled or missing?)
            return Response(404, {"code": 404})
        raise AssertionError(f"unexpected request {req}")


def drive_the_reporter() -> list[Request]:
    client = RecordingClient()
    raw = RawApi(client)  # type: ignore[arg-type]
    # The layout the program deploys: one reporter for the stack, shared watches.
    observer = Observer(raw, Metrics(), deployments=[NAME], shared_watches=True)
    observer.cr_informers[0].relist()
    for _ in range(2):  # the CR's informers exist after its ADDED event
        for inf in observer.all_informers():
            inf.relist()
            inf.watch_once()
    writer = StatusWriter(
        KubeStatusApi(raw),
        observer,
        Metrics(),
        is_leader=lambda: True,
        event_namespace="default",
        backoff=Backoff(rng=random.Random(0)),
        now=lambda: datetime(2030, 1, 1, tzinfo=UTC),
        sleep=lambda _s: None,
    )
    assert writer.reconcile(NAME)  # 409 first: a GET of the CR, then the patch and an Event
    elector = LeaderElector(raw, NS, NAMES.reporter, "me")
    assert elector.try_acquire_or_renew()  # create
    assert elector.try_acquire_or_renew()  # get + update
    for _ in range(3):
        writer.reconcile(NAME)  # steady state: no further reads
    return client.requests


def rules_by_namespace() -> dict[str | None, list[dict]]:
    out: dict[str | None, list[dict]] = {}
    for obj in build_reporter_objects([(NAMES, NS)], NS, "img"):
        if obj["kind"] in ("ClusterRole", "Role"):
            out.setdefault(obj["metadata"].get("namespace"), []).extend(obj["rules"])
    return out


def allows(rule: dict, req: Request) -> bool:
    return (
        req.group in rule["apiGroups"]
        and req.resource in rule["resources"]
        and req.verb in rule["verbs"]
        and (not rule.get("resourceNames") or req.name in rule["resourceNames"])
    )


def test_every_call_is_granted_and_every_grant_is_used() -> None:
    requests = drive_the_reporter()
    rules = rules_by_namespace()
    for req in requests:
        applicable = rules[None] + (rules.get(req.namespace, []) if req.namespace else [])
        assert any(allows(r, req) for r in applicable), f"not granted: {req}"
    for namespace, ns_rules in rules.items():
        for rule in ns_rules:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    assert any(
                        r.verb == verb
                        and r.resource == res
                        and r.group in rule["apiGroups"]
                        and (namespace is None or r.namespace == namespace)
                        for r in requests
                    ), f"granted but never used: {verb} {res} in {namespace or 'cluster'}"


def test_secrets_are_watched_by_label_in_the_driver_namespace_never_read_per_reconcile() -> None:
    requests = drive_the_reporter()
    secret_calls = [r for r in requests if r.resource == "secrets"]
    assert {r.verb for r in secret_calls} == {"list", "watch"}
    assert {(r.namespace, r.name) for r in secret_calls} == {(NS, "")}
    # One informer, listed and watched twice by the driver loop above; the reconciles
    # (four of them) added nothing: a Secret is never read with a GET, not even its metadata.
    assert len(secret_calls) == 2 * 2


def test_namespaced_kinds_are_read_in_the_driver_namespace_only() -> None:
    """Review of issue 16: pods, workloads, Secrets are never listed cluster-wide."""
    namespaced = {"pods", "services", "serviceaccounts", "daemonsets", "statefulsets"}
    namespaced |= {"roles", "rolebindings", "secrets"}
    for req in drive_the_reporter():
        if req.resource in namespaced:
            assert req.namespace == NS, req

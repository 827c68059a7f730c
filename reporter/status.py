"""Pure computation of a Deployment CR's ``.status`` from an ``Observed`` snapshot.

Nothing here does I/O, so every rule is unit-testable with hand-built dicts and the writer
can recompute on every event without cost. The shape follows the reference operator
(intel/pmem-csi d01bc59, ``deployment_types.go``) so existing ``kubectl`` habits and scripts
keep working, with two upgrades: conditions use the KEP-1623 (``metav1.Condition``) shape, and
readiness follows the kstatus rules instead of only comparing two counters.

Phases follow kstatus' three outcomes, so that a rollout or a node joining a large cluster is
not reported as a failure (at thousands of nodes one node is always starting, and a binary
Running/Failed phase would flap and fire Warning Events all day):
- ``Running`` (kstatus Current): every condition True and both driver components Ready.
- ``Progressing`` (kstatus InProgress): not there yet, but nothing is known to be broken --
  pods starting, a rollout under way, a node not ready, an object that could not be read.
- ``Failed``: a real failure -- a missing, relabelled or changed object, missing or invalid
  certificates, or a component that does not serve at all (no ready pod, and its pods crash
  looping, failing to pull their image, unschedulable or failed) -- or no progress for longer
  than the progress deadline (``DEFAULT_PROGRESS_DEADLINE``, the default of a Deployment's
  ``progressDeadlineSeconds``). Progress is measured from the last change of any unready
  component's reason, so a rollout that keeps moving never times out; what could not be read
  or checked (an Unknown condition, an unreadable workload) is not known to be stuck and
  never times out.

In proportion at scale (at thousands of nodes one node is always broken): once the
DaemonSet's rollout is finished, up to ``node_tolerance(desired)`` unavailable node pods (1 %
of the selected nodes, rounded down: none below 100 nodes, 50 at 5,000) leave the Node
component ``Ready`` -- the driver serves, like a Deployment whose unavailable pods stay within
``maxUnavailable`` -- with those pods named in its reason (``degraded_node_pods``; the writer
records a Warning Event for each newly broken one). More than that is ``Progressing`` and
runs into the progress deadline if it does not change, as a stuck Deployment does
(``ProgressDeadlineExceeded``). One broken pod of a small cluster is therefore
``Progressing`` at once and ``Failed`` only after the deadline.

Timestamps are carried over from the current status wherever the meaning did not change,
because a timestamp that moves on every resync would make every resync a write.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

from pmem_components.fieldowners import describe, foreign_owners
from pmem_components.names import (
    CRD_KIND,
    LABEL_INSTANCE,
    LABEL_PART_OF,
    PART_OF,
    SPEC_DIGEST_ANNOTATION,
    spec_digest,
)
from reporter.certcheck import Validator, default_verifier
from reporter.model import (
    DAEMON_SET,
    POD,
    SECRET,
    STATEFUL_SET,
    ExpectedObject,
    Obj,
    Observed,
    expected_objects,
)

# Condition types (reference: deployment_types.go).
CERTS_READY = "CertsReady"
CERTS_VERIFIED = "CertsVerified"
DRIVER_DEPLOYED = "DriverDeployed"
CONDITION_TYPES = (CERTS_READY, CERTS_VERIFIED, DRIVER_DEPLOYED)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

# Driver components and their states (reference: DriverType.String(), DriverStatus).
CONTROLLER = "Controller"
NODE = "Node"
READY = "Ready"
NOT_READY = "NotReady"

# Phases (reference: DeploymentPhase, plus kstatus' InProgress). PHASE_NEW is what an
# unobserved CR shows. The CRD's status.phase enum lists exactly these.
PHASE_NEW = ""
PHASE_RUNNING = "Running"
PHASE_PROGRESSING = "Progressing"
PHASE_FAILED = "Failed"
PHASES = (PHASE_NEW, PHASE_RUNNING, PHASE_PROGRESSING, PHASE_FAILED)

# How long a deployment may make no progress before Progressing turns into Failed.
DEFAULT_PROGRESS_DEADLINE = timedelta(seconds=600)

# Container waiting reasons that are failures, not steps of a normal start (kubelet's names).
FAILING_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)

RUNNING_REASON = "All driver components are deployed successfully"

# Share of a finished DaemonSet rollout's pods that may be unavailable while the Node
# component still counts as Ready (module docstring).
NODE_TOLERANCE_FRACTION = 0.01


def node_tolerance(desired: int) -> int:
    """How many of ``desired`` node pods may be unavailable after a finished rollout."""
    return int(max(desired, 0) * NODE_TOLERANCE_FRACTION)


SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")

# Waiting reasons that explain a broken pod better than "not ready" does.
_MAX_LISTED_PODS = 5

EventType = Literal["Normal", "Warning"]


# --------------------------------------------------------------------------- helpers


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serializes."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(obj: Mapping[str, Any] | None, *path: str, default: int = 0) -> int:
    """A nested integer field; absent counters are 0 in the API (omitempty)."""
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur or cur[key] is None:
            return default
        cur = cur[key]
    try:
        return int(cur)
    except (TypeError, ValueError):
        return default


def _condition(ctype: str, status: str, reason: str, message: str, generation: int | None) -> Obj:
    cond: Obj = {"type": ctype, "status": status, "reason": reason, "message": message}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


# --------------------------------------------------------------------------- conditions


def _decode_secret(secret: Obj) -> tuple[dict[str, str], list[str]]:
    """Decoded PEM text of the three TLS keys, and the keys that are missing or unusable."""
    data = secret.get("data") or {}
    values: dict[str, str] = {}
    missing: list[str] = []
    for key in SECRET_KEYS:
        raw = data.get(key)
        if not raw:
            missing.append(key)
            continue
        try:
            text = base64.b64decode(raw, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            missing.append(f"{key} (not base64-encoded UTF-8 text)")
            continue
        if not text.strip():
            missing.append(f"{key} (empty)")
            continue
        values[key] = text
    return values, missing


def _certs_ready(
    observed: Observed,
) -> tuple[Obj, dict[str, dict[str, str]] | None]:
    """CertsReady, plus the decoded secrets when it is True (input for CertsVerified)."""
    gen = observed.generation
    ns = observed.namespace
    unreadable = observed.unreadable.get(SECRET)
    if unreadable is not None:
        # A failed read says nothing about the Secrets: not "missing", and no Warning Event.
        message = (
            f"Secrets {ns}/{observed.names.registry_secret} and {ns}/{observed.names.node_secret} "
            f"could not be read: {unreadable}"
        )
        return _condition(CERTS_READY, UNKNOWN, "SecretsUnreadable", message, gen), None
    problems: list[str] = []
    reason = "SecretsComplete"
    decoded: dict[str, dict[str, str]] = {}
    for secret_name in (observed.names.registry_secret, observed.names.node_secret):
        secret = observed.get(SECRET, secret_name)
        if secret is None:
            problems.append(f"Secret {ns}/{secret_name} does not exist")
            reason = "SecretMissing"
            continue
        values, missing = _decode_secret(secret)
        if missing:
            problems.append(f"Secret {ns}/{secret_name} lacks {', '.join(missing)}")
            if reason != "SecretMissing":
                reason = "SecretKeyMissing"
        decoded[secret_name] = values
    if problems:
        return _condition(CERTS_READY, FALSE, reason, "; ".join(problems), gen), None
    message = (
        f"Secrets {ns}/{observed.names.registry_secret} and {ns}/{observed.names.node_secret} "
        f"hold {', '.join(SECRET_KEYS)}"
    )
    return _condition(CERTS_READY, TRUE, reason, message, gen), decoded


def _problem_field(problem: Any, name: str) -> str:
    """Read a CertProblem field whether it is an object or a mapping."""
    if isinstance(problem, Mapping):
        return str(problem.get(name, ""))
    return str(getattr(problem, name, ""))


def _certs_verified(
    observed: Observed,
    decoded: dict[str, dict[str, str]] | None,
    now: datetime,
    verify: Validator,
) -> Obj:
    gen = observed.generation
    if decoded is None:
        return _condition(
            CERTS_VERIFIED,
            UNKNOWN,
            "CertsNotReady",
            "Certificates cannot be verified until CertsReady is True",
            gen,
        )
    names = observed.names
    registry = decoded[names.registry_secret]
    node = decoded[names.node_secret]
    try:
        problems = list(
            verify(
                registry["ca.crt"],
                registry["tls.crt"],
                registry["tls.key"],
                node["tls.crt"],
                node["tls.key"],
                now=now,
                node_ca_cert=node["ca.crt"],
            )
        )
    except Exception as exc:  # a verifier bug must not stop status reporting
        # Nothing is known about the certificates: Unknown, not False (no Failed phase, no
        # Warning Event). Only the exception's type and first line: never key material.
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return _condition(
            CERTS_VERIFIED,
            UNKNOWN,
            "VerificationFailed",
            f"Certificate check could not run: {detail[:200]}",
            gen,
        )
    # Each side verifies its peer with the ca.crt of its own Secret: the verifier checks the
    # registry's certificate against the node Secret's ca.crt and the node's against the
    # registry Secret's (CAMismatch when one side would reject the other). The two may differ
    # legitimately, e.g. while a CA change rolls out (old CA vs. old+new CA bundle).
    errors = [p for p in problems if _problem_field(p, "severity") != "warning"]
    warnings = [p for p in problems if _problem_field(p, "severity") == "warning"]
    messages = "; ".join(_problem_field(p, "message") for p in errors + warnings)
    if errors:
        return _condition(CERTS_VERIFIED, FALSE, _problem_field(errors[0], "reason"), messages, gen)
    if warnings:
        return _condition(
            CERTS_VERIFIED, TRUE, _problem_field(warnings[0], "reason"), messages, gen
        )
    return _condition(
        CERTS_VERIFIED,
        TRUE,
        "CertsValid",
        "Certificates are valid, chain to ca.crt and complete a mutual TLS handshake",
        gen,
    )


# Objects named in an ObjectsModified message; the rest are counted (a status stays small).
_MAX_LISTED_MODIFIED = 3


def _modified(observed: Observed, expected: Sequence[ExpectedObject]) -> list[str]:
    """``Kind/name by manager (paths)`` for each object someone else changed, the CR first:
    an edit of its spec declares something Pulumi did not, and nothing rolls it out."""
    changed = []
    cr_owners = foreign_owners((observed.cr.get("metadata") or {}).get("managedFields"))
    if cr_owners:
        changed.append(f"{CRD_KIND}/{observed.name} by {describe(cr_owners)}")
    for e in expected:
        obj = observed.get(e.kind, e.name)
        owners = foreign_owners(((obj or {}).get("metadata") or {}).get("managedFields"))
        if owners:
            changed.append(f"{e.kind}/{e.name} by {describe(owners)}")
    return changed


def _labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


def _relabelled(observed: Observed, e: ExpectedObject) -> str | None:
    """``Kind/name (labels now: ...; expected: ...)`` when the object exists without our labels."""
    labels = observed.relabelled.get((e.kind, e.name))
    if labels is None:
        return None
    want = {LABEL_PART_OF: PART_OF, LABEL_INSTANCE: observed.names.hyphened}
    wrong = {k: v for k, v in want.items() if labels.get(k) != v}
    return (
        f"{e.kind}/{e.name} (expected {_labels_text(wrong)}; "
        f"has {_labels_text({k: labels[k] for k in want if k in labels})})"
    )


def _driver_deployed(observed: Observed) -> Obj:
    gen = observed.generation
    expected = expected_objects(observed.names)
    readable = [e for e in expected if e.kind not in observed.unreadable]
    absent = [e for e in readable if observed.get(e.kind, e.name) is None]
    relabelled = [text for e in absent if (text := _relabelled(observed, e))]
    missing = [f"{e.kind}/{e.name}" for e in absent if _relabelled(observed, e) is None]
    modified = _modified(observed, readable)
    if missing or relabelled or modified:
        parts = []
        if missing:
            parts.append(f"Missing {', '.join(missing)}")
        if relabelled:
            parts.append(
                "Relabelled (no longer selected as part of this deployment): "
                + "; ".join(relabelled)
            )
        if modified:
            listed = "; ".join(modified[:_MAX_LISTED_MODIFIED])
            more = len(modified) - _MAX_LISTED_MODIFIED
            parts.append(
                f"Changed behind Pulumi's back: {listed}"
                + (f"; and {more} more" if more > 0 else "")
            )
        message = "; ".join(parts) + ("; run `pulumi up --refresh` to restore the declared state")
        reason = (
            "ObjectsMissing"
            if missing
            else "ObjectsRelabelled"
            if relabelled
            else "ObjectsModified"
        )
        return _condition(DRIVER_DEPLOYED, FALSE, reason, message, gen)
    unknown = sorted({e.kind for e in expected} & set(observed.unreadable))
    if unknown:
        message = "; ".join(
            f"{kind} objects could not be read: {observed.unreadable[kind]}" for kind in unknown
        )
        return _condition(DRIVER_DEPLOYED, UNKNOWN, "ObjectsUnreadable", message, gen)
    return _condition(
        DRIVER_DEPLOYED,
        TRUE,
        "AllObjectsExist",
        f"All {len(expected)} driver objects exist, changed by no one but Pulumi",
        gen,
    )


# --------------------------------------------------------------------------- pods


def _pod_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == TRUE
    return False


def _node_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == TRUE
    return False


def pod_problem(pod: Obj) -> str:
    """Why a pod is not ready, as specific as its status allows.

    Container waiting reasons (CrashLoopBackOff, ImagePullBackOff, ...) come first because
    they point at the fix; scheduling and conditions are the fallback.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    sched = conditions.get("PodScheduled")
    if sched and sched.get("status") == FALSE:
        reason = sched.get("reason") or "Unschedulable"
        msg = sched.get("message")
        return f"{reason}: {msg}" if msg else reason
    phase = status.get("phase") or "Pending"
    if phase == "Failed":
        detail = status.get("reason") or status.get("message")
        return f"Failed: {detail}" if detail else "Failed"
    containers = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return f"{waiting['reason']} (container {cs.get('name')})"
    for cs in containers:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            reason = terminated.get("reason") or f"exit code {terminated.get('exitCode')}"
            return f"{reason} (container {cs.get('name')})"
    if phase == "Pending":
        return "Pending"
    statuses = status.get("containerStatuses") or []
    unready = [cs.get("name") for cs in statuses if not cs.get("ready")]
    if unready:
        return f"container(s) {', '.join(str(n) for n in unready)} not ready"
    ready = conditions.get("Ready")
    if ready and ready.get("reason"):
        return f"NotReady: {ready['reason']}"
    return "NotReady"


def pod_failure(pod: Obj) -> str | None:
    """The problem of a pod that is broken rather than on its way (None: not broken).

    A crash loop, an image that cannot be pulled, a pod the scheduler cannot place or a
    pod that ended in phase Failed: each needs a person, so it makes the phase Failed at once.
    Everything else (Pending, ContainerCreating, a node not ready) is progress.
    """
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == FALSE
            and cond.get("reason") == "Unschedulable"
        ):
            return pod_problem(pod)
    if status.get("phase") == "Failed":
        return pod_problem(pod)
    for cs in list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    ):
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") in FAILING_WAITING_REASONS:
            return pod_problem(pod)
    return None


def _pod_name(pod: Obj, missing: str = "?") -> str:
    """A pod's metadata.name as text, ``missing`` when it has none. A garbage object from the
    API or a cache (a null name, a number) is still named and sorted among the others: a sort
    comparing None or an int with a str raised TypeError and stopped the reconcile."""
    name = (pod.get("metadata") or {}).get("name")
    return missing if name is None else str(name)


def failing_pods(observed: Observed) -> frozenset[str]:
    """Names of the driver's pods that are broken rather than on their way (``pod_failure``);
    empty when pods cannot be read. The writer sends a change of this set at once."""
    if POD in observed.unreadable:
        return frozenset()
    return frozenset(
        _pod_name(p) for p in (*observed.controller_pods, *observed.node_pods) if pod_failure(p)
    )


def _failing_pods(pods: Sequence[Obj]) -> str | None:
    """'<pod> on <node>: <problem>' of the first broken pod (by name), and how many more.

    Sorted on (name, node, problem), strings only: two pods of one name (a cache holding a
    replaced pod twice) are both counted, without comparing their dicts (TypeError), and the
    one named is the same whatever the cache's order.
    """
    failing = sorted(
        (_pod_name(p), str((p.get("spec") or {}).get("nodeName") or ""), problem)
        for p in pods
        if (problem := pod_failure(p))
    )
    if not failing:
        return None
    name, node, problem = failing[0]
    text = f"pod {name}{f' on {node}' if node else ''}: {problem}"
    if len(failing) > 1:
        text += f" (and {len(failing) - 1} more failing pod(s))"
    return text


def _describe_pods(pods: Sequence[Obj], nodes: Sequence[Obj] | None) -> list[str]:
    """'<pod> on <node>: <problem>' for each pod that is not ready, sorted for stable text:
    by name (a nameless pod first, as ``?``), then by the text, so that pods of one name
    come in the same order whatever the cache's."""
    node_ready = {(n.get("metadata") or {}).get("name"): _node_ready(n) for n in nodes or []}
    described: list[tuple[str, str]] = []
    for pod in pods:
        if _pod_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        where = f" on {node}" if node else " (not scheduled)"
        if node and node_ready.get(node) is False:
            where += " (node not ready)"
        described.append((_pod_name(pod, ""), f"{_pod_name(pod)}{where}: {pod_problem(pod)}"))
    out = [text for _, text in sorted(described)]
    if len(out) > _MAX_LISTED_PODS:
        out = [*out[:_MAX_LISTED_PODS], f"and {len(out) - _MAX_LISTED_PODS} more"]
    return out


# --------------------------------------------------------------------------- components


def _spec_lag(obj: Obj, observed: Observed) -> str | None:
    """A workload that does not carry the CR's current spec says nothing about generation N.

    Checked by the digest the program writes (``names.SPEC_DIGEST_ANNOTATION``); a workload
    without one (written by an older program) is not checked.
    """
    digest = ((obj.get("metadata") or {}).get("annotations") or {}).get(SPEC_DIGEST_ANNOTATION)
    if digest is None or digest == spec_digest(observed.cr.get("spec") or {}):
        return None
    return (
        f"Rollout in progress: {obj.get('kind') or 'object'} "
        f"{(obj.get('metadata') or {}).get('name')} does not carry generation "
        f"{observed.generation} of the spec yet"
    )


def _generation_lag(obj: Obj) -> str | None:
    """kstatus: a controller that has not seen the latest spec says nothing about it."""
    generation = _int(obj, "metadata", "generation")
    observed = _int(obj, "status", "observedGeneration")
    if observed < generation:
        return (
            f"Rollout in progress: {obj.get('kind') or 'object'} "
            f"{(obj.get('metadata') or {}).get('name')} has not observed generation "
            f"{generation} yet (observed {observed})"
        )
    return None


def _absent(observed: Observed, kind: str, name: str) -> str:
    if (kind, name) in observed.relabelled:
        return "is relabelled (no longer selected as part of this deployment)"
    return "is missing"


def _pod_findings(observed: Observed, pods: Sequence[Obj]) -> tuple[str | None, list[str]]:
    """The first failing pod and the description of unready pods -- unless pods cannot be
    read (401/403): then the cache may be stale, and nothing is said about any pod."""
    if POD in observed.unreadable:
        return None, [f"Pods could not be read: {observed.unreadable[POD]}"]
    return _failing_pods(pods), _describe_pods(pods, observed.nodes)


class BrokenPod(NamedTuple):
    """A node pod that is not ready after its DaemonSet finished rolling out."""

    pod: str
    node: str | None
    problem: str


def degraded_node_pods(observed: Observed) -> list[BrokenPod]:
    """The node pods that keep a finished rollout from being whole, sorted by pod name.

    Empty during a rollout (pods restarting on their way are progress, not broken nodes),
    without a DaemonSet, and when pods cannot be read (a stale cache names nobody).
    """
    ds = observed.get(DAEMON_SET, observed.names.node_driver)
    if ds is None or POD in observed.unreadable or DAEMON_SET in observed.unreadable:
        return []
    ds = {"kind": DAEMON_SET, **ds}
    desired = _int(ds, "status", "desiredNumberScheduled")
    if (
        _spec_lag(ds, observed)
        or _generation_lag(ds)
        or _int(ds, "status", "updatedNumberScheduled") < desired
    ):
        return []
    # Sorted on strings only (a nameless pod first, as ``?``), by node and problem after the
    # name: pods of one name come in the same order whatever the cache's.
    found: list[tuple[tuple[str, str, str], BrokenPod]] = []
    for pod in observed.node_pods:
        if _pod_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        node, problem = (pod.get("spec") or {}).get("nodeName"), pod_problem(pod)
        key = (_pod_name(pod, ""), str(node or ""), problem)
        found.append((key, BrokenPod(_pod_name(pod), node, problem)))
    return [broken for _, broken in sorted(found, key=lambda f: f[0])]


def tolerated_node_pods(observed: Observed) -> frozenset[str]:
    """Names of the broken node pods the "few broken nodes" rule tolerates (the driver counts
    as serving, ``NODE_TOLERANCE_FRACTION``); empty when they are more than that. Their
    coming and going is not urgent for the writer: it changes only the message."""
    broken = degraded_node_pods(observed)
    if not broken:
        return frozenset()
    ds = observed.get(DAEMON_SET, observed.names.node_driver) or {}
    desired = _int(ds, "status", "desiredNumberScheduled")
    serving = _node_serving(ds, observed)
    if serving <= 0 or desired - serving > node_tolerance(desired):
        return frozenset()
    return frozenset(b.pod for b in broken)


def _node_serving(ds: Obj, observed: Observed) -> int:
    """The nodes whose driver pod serves: the DaemonSet's ready and available counters, or
    fewer when its pods, as cached, say so.

    The counters lag the pods: the DaemonSet controller recounts all of a DaemonSet's pods
    after a change, which takes a while at thousands of nodes (in the 5,000-node benchmark a
    pod that began to crash-loop was named only once numberReady fell, about half a second
    later). So a node counts as not serving at once when none of its pods is ready (pods on
    their way out left aside, as an old pod of a rollout; a node with a ready pod beside a
    broken one, a surge pod, serves). The controller counts the nodes it should run on, and
    the cache may hold pods of nodes it does not count (an orphan on a deleted node until the
    pod garbage collector removes it, a new node's pod before desiredNumberScheduled rises):
    as many unready nodes as the cache has nodes beyond ``desired`` are taken to be those,
    not broken ones. A node seen serving again waits for the counters, as the phase's way
    back to Running already does. Nothing is taken from pods that cannot be read.
    """
    serving = min(_int(ds, "status", "numberReady"), _int(ds, "status", "numberAvailable"))
    if POD in observed.unreadable:
        return serving
    nodes: dict[str, bool] = {}
    for i, pod in enumerate(observed.node_pods):
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        # An unscheduled pod stands for a node of its own.
        node = (pod.get("spec") or {}).get("nodeName") or f"\0unscheduled-{i}"
        nodes[node] = nodes.get(node, False) or _pod_ready(pod)
    desired = _int(ds, "status", "desiredNumberScheduled")
    unready = sum(1 for ready in nodes.values() if not ready)
    uncounted = max(0, len(nodes) - desired)
    return max(0, min(serving, desired - max(0, unready - uncounted)))


class ComponentState(NamedTuple):
    """A driver component's Ready/NotReady with its reason, and why it is broken (if it is)."""

    status: str
    reason: str
    failure: str | None = None
    # NotReady because its workload could not be read: nothing known, so it never runs into
    # the progress deadline (``_phase``).
    unknown: bool = False


def _node_component(observed: Observed) -> ComponentState:
    name = observed.names.node_driver
    if DAEMON_SET in observed.unreadable:
        return ComponentState(
            NOT_READY,
            f"DaemonSets could not be read: {observed.unreadable[DAEMON_SET]}",
            unknown=True,
        )
    ds = observed.get(DAEMON_SET, name)
    if ds is None:
        return ComponentState(
            NOT_READY,
            f"Node driver DaemonSet {observed.namespace}/{name} "
            f"{_absent(observed, DAEMON_SET, name)}",
        )
    ds = {"kind": DAEMON_SET, **ds}
    lag = _spec_lag(ds, observed) or _generation_lag(ds)
    failure, pods = _pod_findings(observed, observed.node_pods)
    desired = _int(ds, "status", "desiredNumberScheduled")
    current = _int(ds, "status", "currentNumberScheduled")
    updated = _int(ds, "status", "updatedNumberScheduled")
    available = _int(ds, "status", "numberAvailable")
    ready = _int(ds, "status", "numberReady")
    serving = _node_serving(ds, observed)
    if min(ready, available) > 0:
        # Some nodes serve: broken pods are progress (or tolerated), see above. Judged by the
        # counters alone: the cache cannot tell a pod they do not count from a broken one.
        failure = None
    if lag:
        return ComponentState(NOT_READY, "; ".join([lag, *pods]), failure)
    if desired == 0:
        # kstatus: a DaemonSet that selects no node has nothing left to do (Current).
        return ComponentState(READY, "No node is selected for the node driver (0 pods needed)")
    parts: list[str] = []
    if updated < desired:
        parts.append(f"Rollout in progress: {updated} of {desired} node driver pod(s) updated")
    if current < desired:
        parts.append(f"{current} of {desired} nodes run a node driver pod")
    if serving < desired:
        parts.append(f"{serving} out of {desired} driver pods are ready")
    unavailable = desired - serving
    tolerated = node_tolerance(desired)
    if parts and updated >= desired and unavailable <= tolerated:
        # A finished rollout with a few broken nodes: the driver serves (module docstring).
        return ComponentState(
            READY,
            "; ".join(
                [
                    f"{serving} of {desired} node driver pod(s) ready, {unavailable} not "
                    f"(up to {tolerated} tolerated)",
                    *pods,
                ]
            ),
        )
    if parts:
        return ComponentState(NOT_READY, "; ".join(parts + pods), failure)
    return ComponentState(READY, f"All {desired} node driver pod(s) running successfully")


def _controller_component(observed: Observed) -> ComponentState:
    name = observed.names.controller_driver
    if STATEFUL_SET in observed.unreadable:
        return ComponentState(
            NOT_READY,
            f"StatefulSets could not be read: {observed.unreadable[STATEFUL_SET]}",
            unknown=True,
        )
    ss = observed.get(STATEFUL_SET, name)
    if ss is None:
        return ComponentState(
            NOT_READY,
            f"Controller driver StatefulSet {observed.namespace}/{name} "
            f"{_absent(observed, STATEFUL_SET, name)}",
        )
    ss = {"kind": STATEFUL_SET, **ss}
    lag = _spec_lag(ss, observed) or _generation_lag(ss)
    failure, pods = _pod_findings(observed, observed.controller_pods)
    spec_replicas = _int(ss, "spec", "replicas", default=1)
    replicas = _int(ss, "status", "replicas")
    ready = _int(ss, "status", "readyReplicas")
    if ready > 0:
        failure = None  # a ready controller serves; a broken second pod is progress
    if lag:
        return ComponentState(NOT_READY, "; ".join([lag, *pods]), failure)
    current = _int(ss, "status", "currentReplicas")
    updated = _int(ss, "status", "updatedReplicas")
    current_rev = (ss.get("status") or {}).get("currentRevision")
    update_rev = (ss.get("status") or {}).get("updateRevision")
    if spec_replicas == 0:
        return ComponentState(NOT_READY, "Controller stateful set is scaled to 0 replicas")
    parts: list[str] = []
    if replicas > spec_replicas:
        parts.append(f"Waiting for {replicas - spec_replicas} extra pod(s) to terminate")
    strategy = (ss.get("spec") or {}).get("updateStrategy") or {}
    partition = 0
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        partition = _int(strategy, "rollingUpdate", "partition")
        want_updated = max(spec_replicas - partition, 0)
        if updated < want_updated:
            parts.append(
                f"Rollout in progress: {updated} of {want_updated} controller pod(s) updated"
            )
        elif partition == 0 and current_rev and update_rev and current_rev != update_rev:
            parts.append(f"Rollout in progress: waiting for revision {update_rev}")
    if ready < spec_replicas:
        parts.append(
            f"Waiting for stateful set to be ready: {ready} of {spec_replicas} replicas are ready"
        )
    elif current < spec_replicas and not parts and partition == 0:
        # With a partition, pods below it stay at the old revision by design: kstatus calls
        # a partitioned rollout done once the pods above the partition are updated.
        parts.append(f"{current} of {spec_replicas} controller pod(s) at the current revision")
    if parts:
        return ComponentState(NOT_READY, "; ".join(parts + pods), failure)
    return ComponentState(
        READY, f"{ready} instance(s) of controller driver is running successfully"
    )


# --------------------------------------------------------------------------- status


# Replicas' and the API server's clocks differ a little; a time further off is not ours.
CLOCK_SKEW_SECONDS = 300.0


def _parse_stamp(value: Any) -> datetime | None:
    try:
        return _utc(datetime.fromisoformat(str(value).replace("Z", "+00:00")))
    except ValueError:
        return None


def without_implausible_times(old: Obj, cr: Obj, now: datetime) -> Obj:
    """``old`` minus timestamps the reporter cannot have written, so they are not carried.

    Another writer may have filled the status with garbage; a lastTransitionTime in the
    future, before the CR existed, or not a time at all would otherwise survive every
    rewrite of an otherwise correct condition.
    """
    created = _parse_stamp((cr.get("metadata") or {}).get("creationTimestamp"))
    clean = copy.deepcopy(old)
    for entries, stamp in (
        ("conditions", "lastTransitionTime"),
        ("driverComponents", "lastUpdated"),
    ):
        for entry in clean.get(entries) or []:
            if not isinstance(entry, dict) or stamp not in entry:
                continue
            t = _parse_stamp(entry[stamp])
            if (
                t is None
                or (t - now).total_seconds() > CLOCK_SKEW_SECONDS
                or (created is not None and (created - t).total_seconds() > CLOCK_SKEW_SECONDS)
            ):
                del entry[stamp]
    return clean


def _carry_condition_times(conditions: list[Obj], old: Obj, now_s: str) -> None:
    """lastTransitionTime moves only when a condition's status flips (KEP-1623)."""
    previous = {c.get("type"): c for c in old.get("conditions") or []}
    for cond in conditions:
        prev = previous.get(cond["type"])
        if prev and prev.get("status") == cond["status"] and prev.get("lastTransitionTime"):
            cond["lastTransitionTime"] = prev["lastTransitionTime"]
        else:
            cond["lastTransitionTime"] = now_s


# A pod's part of a component's reason (``_describe_pods``): "<pod> on <node>[ (node not
# ready)]: <problem>" or "<pod> (not scheduled): <problem>".
_POD_PART = re.compile(r"^(\S+(?: on \S+| \(not scheduled\))(?: \(node not ready\))?): ")


def _progress_key(reason: str) -> str:
    """The reason without each pod's problem text: what progress is measured on.

    Why: a broken pod's problem alternates by itself (ErrImagePull and ImagePullBackOff,
    CrashLoopBackOff and Error, as the kubelet backs off). Counted as progress, that kept a
    stuck rollout or a crash loop Progressing for ever; a pod that becomes ready, a count
    that changes, a pod on another node still do count.
    """
    parts = []
    for part in reason.split("; "):
        match = _POD_PART.match(part)
        parts.append(match.group(1) if match else part)
    return "; ".join(parts)


def _component(component: str, state: ComponentState, old: Obj, now_s: str) -> Obj:
    """A driverComponents entry; lastUpdated only moves when the status or the reason changed,
    a pod's problem text aside (``_progress_key``): the progress deadline is measured on it."""
    status, reason = state.status, state.reason
    entry: Obj = {"component": component, "status": status, "reason": reason}
    for prev in old.get("driverComponents") or []:
        if (
            prev.get("component") == component
            and prev.get("status") == status
            and _progress_key(str(prev.get("reason", ""))) == _progress_key(reason)
            and prev.get("lastUpdated")
        ):
            entry["lastUpdated"] = prev["lastUpdated"]
            break
    else:
        entry["lastUpdated"] = now_s
    return entry


def _summary(conditions: Iterable[Obj], components: Iterable[Obj]) -> str:
    """Short reason for a phase other than Running: what is not done, first cause first."""
    parts: list[str] = []
    for cond in conditions:
        if cond["status"] != TRUE:
            parts.append(f"{cond['type']} is {cond['status']} ({cond['reason']})")
    for comp in components:
        if comp["status"] != READY:
            first = comp["reason"].split("; ", 1)[0]
            parts.append(f"{comp['component']} driver is {comp['status']}: {first}")
    return "; ".join(parts)


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _phase(
    conditions: Sequence[Obj],
    components: Sequence[Obj],
    failures: Sequence[str],
    now: datetime,
    progress_deadline: timedelta,
    unknown: frozenset[str] = frozenset(),
) -> tuple[str, str]:
    """Phase and its reason from conditions, components and real failures (module docstring).

    Only what is known to be unfinished runs into the progress deadline: a NotReady
    component whose workload was read. An Unknown condition (unreadable, the check crashed)
    and a component in ``unknown`` (its workload unreadable) say nothing about progress;
    timed out, they made the CR Failed (and fired a Warning Event) over what the reporter
    could not see (issue 16: Unknown, never a verdict).
    """
    if all(c["status"] == TRUE for c in conditions) and all(
        c["status"] == READY for c in components
    ):
        tolerated = [
            f"{c['component']} driver: {c['reason'].split('; ', 1)[0]}"
            for c in components
            if "tolerated)" in c["reason"]
        ]
        return PHASE_RUNNING, "; ".join([RUNNING_REASON, *tolerated])
    summary = _summary(conditions, components)
    if any(c["status"] == FALSE for c in conditions) or failures:
        return PHASE_FAILED, "; ".join([*failures, summary]) if failures else summary
    # The last change of anything unfinished is the last sign of progress.
    # (No condition here is False, or the phase is Failed above: the rest are Unknown.)
    stamps = [
        _parse_time(c.get("lastUpdated"))
        for c in components
        if c["status"] != READY and c["component"] not in unknown
    ]
    known = [t for t in stamps if t is not None]
    if known and now - max(known) > progress_deadline:
        minutes = int(progress_deadline.total_seconds() // 60)
        return PHASE_FAILED, f"No progress for more than {minutes} minute(s): {summary}"
    return PHASE_PROGRESSING, summary


def compute_status(
    observed: Observed,
    now: datetime,
    *,
    verify_certs: Validator | None = None,
    progress_deadline: timedelta = DEFAULT_PROGRESS_DEADLINE,
) -> Obj:
    """The full desired ``.status`` of the CR in ``observed``.

    Yields phase Running, Progressing or Failed (module docstring); ``""`` (PHASE_NEW) only
    exists before the first write. Timestamps of unchanged parts are taken from the CR's
    current status. ``verify_certs`` defaults to the process-wide memoized verifier
    (reporter.certcheck).
    """
    now = _utc(now)
    old = without_implausible_times(observed.current_status, observed.cr, now)
    now_s = format_time(now)
    certs_ready, decoded = _certs_ready(observed)
    conditions = [
        certs_ready,
        _certs_verified(observed, decoded, now, verify_certs or default_verifier),
        _driver_deployed(observed),
    ]
    _carry_condition_times(conditions, old, now_s)
    states = {CONTROLLER: _controller_component(observed), NODE: _node_component(observed)}
    components = [_component(name, state, old, now_s) for name, state in states.items()]
    failures = [f"{name} driver: {st.failure}" for name, st in states.items() if st.failure]
    unknown = frozenset(name for name, st in states.items() if st.unknown)
    phase, reason = _phase(conditions, components, failures, now, progress_deadline, unknown)
    status: Obj = {
        "phase": phase,
        "reason": reason,
        "conditions": conditions,
        "driverComponents": components,
        "lastUpdated": now_s,
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    return status


# --------------------------------------------------------------------------- comparison


def semantic_key(status: Mapping[str, Any] | None) -> str:
    """A canonical form of a status without its timestamps.

    Two statuses with the same key mean the same thing; the writer patches only when the key
    changes, which is what keeps a steady state free of writes.
    """
    s = copy.deepcopy(dict(status or {}))
    s.pop("lastUpdated", None)
    for cond in s.get("conditions") or []:
        cond.pop("lastTransitionTime", None)
        cond.pop("lastUpdateTime", None)  # v1alpha1's name for it
    for comp in s.get("driverComponents") or []:
        comp.pop("lastUpdated", None)
    return json.dumps(s, sort_keys=True, separators=(",", ":"), default=str)


def status_equal_ignoring_time(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Same meaning, timestamps aside -- unless one of ``a``'s timestamps is missing, not a
    time, or beyond ``b``'s lastUpdated (plus clock skew): garbage from another writer, which
    ``compute_status`` does not carry and which must therefore be written over."""
    return semantic_key(a) == semantic_key(b) and not _impossible_times(a, b)


def _impossible_times(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    latest = _parse_stamp((b or {}).get("lastUpdated"))
    if latest is None:
        return False
    stamps = [(a or {}).get("lastUpdated")]
    stamps += [c.get("lastTransitionTime") for c in (a or {}).get("conditions") or []]
    stamps += [c.get("lastUpdated") for c in (a or {}).get("driverComponents") or []]
    for stamp in stamps:
        t = _parse_stamp(stamp)
        if t is None or (t - latest).total_seconds() > CLOCK_SKEW_SECONDS:
            return True
    return False


def phase_event(
    old_status: Mapping[str, Any] | None, new_status: Mapping[str, Any]
) -> tuple[EventType, str, str] | None:
    """The Kubernetes Event to record on the CR when its phase changes, else None.

    Reasons are the reference operator's (Running / Failed) so existing event filters match.
    Entering Progressing records nothing: at thousands of nodes some node is always joining,
    and an Event per join would be noise; only real failures warn.
    """
    old_phase = (old_status or {}).get("phase") or PHASE_NEW
    new_phase = new_status.get("phase") or PHASE_NEW
    if new_phase in (old_phase, PHASE_NEW, PHASE_PROGRESSING):
        return None
    if new_phase == PHASE_RUNNING:
        return "Normal", "Running", "Driver deployment successful"
    return "Warning", "Failed", str(new_status.get("reason") or "Driver deployment failed")

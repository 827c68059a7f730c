"""The reporter's status rules (:mod:`reporter.status`): cases that mutation testing found
open in test_status.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator

import pytest
from test_status import BAD, NAMES, NOW, comp, daemonset, node_pods, observed, pod, with_changes

from pmem_components import names as n
from reporter import status as st


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- node readiness


def test_only_pods_on_nodes_that_are_not_ready_say_so() -> None:
    ready = {
        "metadata": {"name": "worker-1"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]
        },
    }
    unknown = {"metadata": {"name": "worker-2"}, "status": {}}  # no Ready condition yet
    other = f"{NAMES.hyphened}-node-1"
    pods = [node_pods(1)[0], pod(other, "worker-1", ready=False), pod(BAD, "worker-2", ready=False)]
    s = st.compute_status(
        observed(with_changes(ds=daemonset(3, 1)), nodepods=pods, nodes=[ready, unknown]), NOW
    )
    reason = comp(s, "Node")["reason"]
    assert f"{other} on worker-1: " in reason
    assert f"{other} on worker-1 (node not ready)" not in reason
    assert f"{BAD} on worker-2 (node not ready): " in reason


# --------------------------------------------------------------------------- semantic_key


def test_the_semantic_key_ignores_v1alpha1_update_times_and_key_order() -> None:
    a = {
        "phase": "Running",
        "conditions": [{"type": "A", "status": "True", "lastUpdateTime": "2020-01-01T00:00:00Z"}],
        "driverComponents": [{"component": "Node", "status": "Ready"}],  # no lastUpdated
    }
    b = {
        "driverComponents": [{"status": "Ready", "component": "Node"}],
        "conditions": [{"lastUpdateTime": "2030-01-01T00:00:00Z", "status": "True", "type": "A"}],
        "phase": "Running",
    }
    assert st.semantic_key(a) == st.semantic_key(b)


def test_the_semantic_key_takes_values_json_does_not_know() -> None:
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert st.semantic_key({"x": when}) == st.semantic_key({"x": when})
    assert st.semantic_key({"x": when}) != st.semantic_key({"x": when + dt.timedelta(1)})


# --------------------------------------------------------------------------- impossible times


def test_a_garbage_top_level_time_is_written_over_even_with_good_condition_times() -> None:
    b = {
        "phase": "Running",
        "lastUpdated": _stamp(NOW),
        "conditions": [{"type": "A", "status": "True", "lastTransitionTime": _stamp(NOW)}],
    }
    a = {**b, "lastUpdated": "not a time"}
    assert not st.status_equal_ignoring_time(a, b)


def test_times_up_to_the_clock_skew_ahead_are_plausible() -> None:
    b = {"phase": "Running", "lastUpdated": _stamp(NOW)}
    at_limit = {**b, "lastUpdated": _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS))}
    beyond = {**b, "lastUpdated": _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS + 1))}
    assert st.status_equal_ignoring_time(at_limit, b)
    assert not st.status_equal_ignoring_time(beyond, b)


# --------------------------------------------------------------------------- events


def test_a_failure_without_a_reason_still_says_what_failed() -> None:
    assert st.phase_event({"phase": "Running"}, {"phase": "Failed"}) == (
        "Warning",
        "Failed",
        "Driver deployment failed",
    )


# --------------------------------------------------------------------------- pod_problem


def _pod(phase: str | None = "Running", *, conditions: list | None = None, **status: object):
    st_: dict = {"conditions": conditions or [], **status}
    if phase is not None:
        st_["phase"] = phase
    return {"metadata": {"name": "p"}, "status": st_}


def _cs(name: str, state: dict | None = None, ready: bool = False) -> dict:
    return {"name": name, "ready": ready, "state": state or {"running": {}}}


UNSCHEDULED = {"type": "PodScheduled", "status": "False"}


@pytest.mark.parametrize(
    ("pod", "problem"),
    [
        ({"metadata": {"name": "p", "deletionTimestamp": "2030-01-01T00:00:00Z"}}, "Terminating"),
        (
            _pod(
                "Pending",
                conditions=[
                    {**UNSCHEDULED, "reason": "Unschedulable", "message": "0/3 nodes are available"}
                ],
            ),
            "Unschedulable: 0/3 nodes are available",
        ),
        (
            _pod("Pending", conditions=[{**UNSCHEDULED, "reason": "SchedulingGated"}]),
            "SchedulingGated",
        ),
        (_pod("Pending", conditions=[{**UNSCHEDULED, "message": "why"}]), "Unschedulable: why"),
        (_pod("Failed", reason="Evicted", message="low memory"), "Failed: Evicted"),
        (_pod("Failed", message="low memory"), "Failed: low memory"),
        (_pod("Failed"), "Failed"),
        (
            _pod(
                "Pending",
                initContainerStatuses=[_cs("init", {"waiting": {"reason": "ErrImagePull"}})],
                containerStatuses=[_cs("c", {"waiting": {"reason": "PodInitializing"}})],
            ),
            "ErrImagePull (container init)",
        ),
        (
            _pod(containerStatuses=[_cs("c", {"terminated": {"exitCode": 1, "reason": "Error"}})]),
            "Error (container c)",
        ),
        (
            _pod(containerStatuses=[_cs("c", {"terminated": {"exitCode": 2}})]),
            "exit code 2 (container c)",
        ),
        # A terminated container without an exit code, or with exit code 0, is no failure.
        (
            _pod(
                containerStatuses=[
                    _cs("a", {"terminated": {"reason": "Completed"}}),
                    _cs("b", {"terminated": {"exitCode": 0}}),
                ]
            ),
            "container(s) a, b not ready",
        ),
        (_pod(None), "Pending"),
        (_pod("Pending"), "Pending"),
        (
            _pod(
                containerStatuses=[_cs("a", ready=True)],
                conditions=[
                    {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}
                ],
            ),
            "NotReady: ReadinessGatesNotReady",
        ),
        (_pod(containerStatuses=[_cs("a", ready=True)]), "NotReady"),
    ],
)
def test_why_a_pod_is_not_ready(pod: dict, problem: str) -> None:
    assert st.pod_problem(pod) == problem


# --------------------------------------------------------------------------- conditions and reasons


def test_complete_secrets_say_what_they_hold() -> None:
    from test_status import NS, cond

    s = st.compute_status(observed(), NOW)
    ready = cond(s, "CertsReady")
    assert ready["message"] == (
        f"Secrets {NS}/{NAMES.registry_secret} and {NS}/{NAMES.node_secret} "
        "hold ca.crt, tls.crt, tls.key"
    )


def test_certificates_are_not_verified_before_the_secrets_are_complete() -> None:
    from test_status import SECRET, cond, good_objects

    objects = good_objects()
    objects[SECRET][NAMES.node_secret] = None
    verified = cond(st.compute_status(observed(objects), NOW), "CertsVerified")
    assert (verified["status"], verified["reason"], verified["message"]) == (
        "Unknown",
        "CertsNotReady",
        "Certificates cannot be verified until CertsReady is True",
    )


def test_a_pod_without_a_ready_condition_is_not_ready() -> None:
    pods = [*node_pods(2), {**pod(BAD, "worker-2"), "status": {"phase": "Running"}}]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 2)), nodepods=pods), NOW)
    assert f"{BAD} on worker-2: " in comp(s, "Node")["reason"]


def test_only_a_pod_scheduled_condition_makes_unschedulable_a_failure() -> None:
    odd = _pod(
        "Running",
        conditions=[{"type": "Ready", "status": "False", "reason": "Unschedulable"}],
        containerStatuses=[_cs("c")],
    )
    assert st.pod_failure(odd) is None


def test_unready_pods_are_listed_by_name_and_five_at_most() -> None:
    names_ = [f"{NAMES.hyphened}-node-{c}" for c in "edcba"]
    pods = [pod(n, f"w-{n[-1]}", ready=False) for n in names_]
    s = st.compute_status(observed(with_changes(ds=daemonset(5, 0)), nodepods=pods), NOW)
    reason = comp(s, "Node")["reason"]
    listed = [f"{n} on w-{n[-1]}" for n in sorted(names_)]
    positions = [reason.index(text) for text in listed]
    assert positions == sorted(positions)
    assert "more" not in reason  # exactly five: no "and 0 more"


def test_a_controller_behind_its_generation_is_named_by_kind_and_name() -> None:
    ds = daemonset(3, generation=3, observed_generation=2)
    s = st.compute_status(observed(with_changes(ds=ds)), NOW)
    assert (
        f"Rollout in progress: DaemonSet {NAMES.node_driver} has not observed generation 3 yet "
        "(observed 2)"
    ) in comp(s, "Node")["reason"]


def test_the_phase_reason_names_only_a_components_first_problem() -> None:
    pods = [pod(f"{NAMES.hyphened}-node-{i}", f"worker-{i}", ready=False) for i in range(2)]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 0)), nodepods=pods), NOW)
    node_reason = comp(s, "Node")["reason"]
    first, _, rest = node_reason.partition("; ")
    assert rest  # several problems
    assert f"Node driver is NotReady: {first}" in s["reason"]
    assert rest not in s["reason"]


# --------------------------------------------------------------------------- controller, unreadable


def test_a_controller_scaled_to_zero_says_so() -> None:
    from test_status import statefulset

    s = st.compute_status(observed(with_changes(ss=statefulset(0)), ctrl_pods=[]), NOW)
    assert comp(s, "Controller")["reason"] == "Controller stateful set is scaled to 0 replicas"


def test_extra_controller_pods_are_waited_for() -> None:
    from test_status import statefulset

    ss = statefulset(1)
    ss["status"]["replicas"] = 3
    s = st.compute_status(observed(with_changes(ss=ss)), NOW)
    assert "Waiting for 2 extra pod(s) to terminate" in comp(s, "Controller")["reason"]


def test_objects_that_cannot_be_read_make_driver_deployed_unknown() -> None:
    import dataclasses

    from test_status import cond

    o = dataclasses.replace(observed(), unreadable={"Service": "401 Unauthorized"})
    deployed = cond(st.compute_status(o, NOW), "DriverDeployed")
    assert (deployed["status"], deployed["reason"]) == ("Unknown", "ObjectsUnreadable")


def test_a_failed_certificate_check_records_the_generation_it_saw() -> None:
    from test_status import _node_secret_with, cond

    s = st.compute_status(observed(_node_secret_with("foreign_node")), NOW)
    verified = cond(s, "CertsVerified")
    assert verified["status"] == "False"
    assert verified["observedGeneration"] == 4  # the CR's generation (test_status.cr)


def test_a_transition_time_up_to_one_clock_skew_ahead_is_kept() -> None:
    cr = {"metadata": {"name": "x"}}
    at_limit = _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS))
    beyond = _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS + 1))
    old = {
        "conditions": [
            {"type": "A", "status": "True", "lastTransitionTime": at_limit},
            {"type": "B", "status": "True", "lastTransitionTime": beyond},
        ]
    }
    kept = st.without_implausible_times(old, cr, NOW)
    assert kept["conditions"][0]["lastTransitionTime"] == at_limit
    assert "lastTransitionTime" not in kept["conditions"][1]


def test_failing_pods_are_the_broken_ones_of_the_controller_and_the_nodes() -> None:
    """What the writer sends at once (``failing_pods``): the names of the broken pods among
    both the controller's and the nodes' pods, none of those merely on their way; nothing
    when pods cannot be read (then nothing is known to be broken)."""
    crashing = pod(BAD, "worker-2", ready=False, waiting="CrashLoopBackOff")
    unplaced = pod(f"{NAMES.controller_driver}-0", None, unschedulable="0/3 nodes")
    starting = pod(f"{NAMES.hyphened}-node-1", "worker-1", ready=False, waiting="ContainerCreating")
    nameless = pod("x", "worker-0", ready=False, waiting="ImagePullBackOff")
    del nameless["metadata"]["name"]
    seen = observed(ctrl_pods=[unplaced], nodepods=[*node_pods(1), starting, crashing, nameless])
    assert st.failing_pods(seen) == frozenset({BAD, f"{NAMES.controller_driver}-0", "?"})
    assert st.failing_pods(observed()) == frozenset()
    unreadable = dataclasses.replace(seen, unreadable={"Pod": "403 forbidden"})
    assert st.failing_pods(unreadable) == frozenset()


def test_an_object_without_our_labels_says_which_it_lacks_and_that_it_has_none() -> None:
    """The relabelled text: the expected labels sorted and comma-separated, and ``none`` for
    the labels of ours it still has when it has none of them."""
    obs = dataclasses.replace(
        observed(with_changes(ds=None)), relabelled={("DaemonSet", NAMES.node_driver): {}}
    )
    c = next(c for c in st.compute_status(obs, NOW)["conditions"] if c["type"] == "DriverDeployed")
    assert (
        f"DaemonSet/{NAMES.node_driver} (expected {n.LABEL_INSTANCE}={NAMES.hyphened}, "
        f"{n.LABEL_PART_OF}={n.PART_OF}; has none)"
    ) in c["message"]


def test_certificate_problems_given_as_mappings_are_read_like_objects() -> None:
    """A verifier may hand its problems over as mappings (decoded, say): the condition takes
    its reason and message from them as from CertProblem objects, errors first."""
    from test_status import cond

    problems = [
        {"severity": "warning", "reason": "ExpiringSoon", "message": "tls.crt expires soon"},
        {"severity": "error", "reason": "Expired", "message": "ca.crt has expired"},
    ]

    def verify(*_: object, **__: object) -> list[dict[str, str]]:
        return problems

    failed = cond(st.compute_status(observed(), NOW, verify_certs=verify), "CertsVerified")
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "False",
        "Expired",
        "ca.crt has expired; tls.crt expires soon",
    )
    del problems[1]
    warned = cond(st.compute_status(observed(), NOW, verify_certs=verify), "CertsVerified")
    assert (warned["status"], warned["reason"]) == ("True", "ExpiringSoon")


def test_a_certificate_problem_lacking_fields_reads_them_as_empty_never_as_none() -> None:
    """A problem without a reason or message (an object or a mapping) is still an error, and
    the condition shows nothing for what it lacks, not the text ``None`` or a placeholder."""
    from types import SimpleNamespace

    from test_status import cond

    for problem in ({"severity": "error"}, SimpleNamespace(severity="error")):

        def verify(*_: object, problem: object = problem, **__: object) -> list[object]:
            return [problem]

        verified = cond(st.compute_status(observed(), NOW, verify_certs=verify), "CertsVerified")
        assert (verified["status"], verified["reason"], verified["message"]) == ("False", "", "")


def test_a_ready_terminating_pod_is_listed_and_a_nameless_one_first_as_a_question_mark() -> None:
    """A ready pod that is being deleted still holds its node's volumes: it is named as
    Terminating. A pod without a name (a garbage object) is shown as ``?``, sorted before
    every name."""
    from test_status import pod

    terminating = pod("b-pod", "w1")
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    nameless = pod("x", "w2", ready=False)
    del nameless["metadata"]["name"]
    pods = [pod("0-pod", "w3", ready=False), pod("a-pod", "w0"), terminating, nameless]
    assert st._describe_pods(pods, None) == [
        "? on w2: container(s) pmem-driver not ready",
        "0-pod on w3: container(s) pmem-driver not ready",
        "b-pod on w1: Terminating",
    ]


def test_the_phase_reason_joins_the_causes_and_takes_one_problem_per_component() -> None:
    """The CR's one-line reason: every condition that is not True, then each component's first
    problem only (its reason may list several, separated by ``; ``)."""
    conditions = [
        {"type": "CertsReady", "status": "True", "reason": "CertsFound"},
        {"type": "DriverDeployed", "status": "False", "reason": "ObjectsMissing"},
        {"type": "CertsVerified", "status": "Unknown", "reason": "CertsNotReady"},
    ]
    components = [{"component": "Node", "status": "NotReady", "reason": "p1; p2; p3"}]
    assert st._summary(conditions, components) == (
        "DriverDeployed is False (ObjectsMissing); CertsVerified is Unknown (CertsNotReady); "
        "Node driver is NotReady: p1"
    )


# ------------------------------------------------------------- the full run of 2 December 2026
# Cases the mutation run of ``reporter.status`` found open (docs/testing.md, "Survivors left").


def _secret_data(**values: str | None) -> dict[str, object]:
    """The registry Secret of the good objects with some ``data`` values replaced (a None
    value removes the key)."""
    from test_status import secret

    obj = secret(NAMES.registry_secret, "registry")
    for key, value in values.items():
        key = key.replace("_", ".")
        if value is None:
            del obj["data"][key]
        else:
            obj["data"][key] = value
    return obj


def _certs_ready_with(registry: dict[str, object] | None) -> dict[str, object]:
    from test_status import SECRET, cond, good_objects

    objects = good_objects()
    objects[SECRET][NAMES.registry_secret] = registry
    return cond(st.compute_status(observed(objects), NOW), "CertsReady")


def test_every_unusable_key_of_a_secret_is_named_not_only_the_first() -> None:
    """A Secret with several bad keys names each of them, whatever is wrong with the first:
    absent, not base64-encoded UTF-8 text, or only whitespace. Stopping at the first would
    send the administrator round the fix-and-retry loop once per key."""
    from test_status import NS, _b64

    cases = {
        "absent first": (
            {"ca_crt": None, "tls_crt": "%%%", "tls_key": _b64("  \n")},
            "ca.crt, tls.crt (not base64-encoded UTF-8 text), tls.key (empty)",
        ),
        "undecodable first": (
            {"ca_crt": "%%%", "tls_crt": None},
            "ca.crt (not base64-encoded UTF-8 text), tls.crt",
        ),
        "blank first": ({"ca_crt": _b64(" "), "tls_key": ""}, "ca.crt (empty), tls.key"),
    }
    for case, (values, lacks) in cases.items():
        ready = _certs_ready_with(_secret_data(**values))
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "False",
            "SecretKeyMissing",
            f"Secret {NS}/{NAMES.registry_secret} lacks {lacks}",
        ), case


def test_a_secret_value_with_characters_outside_base64_is_unusable() -> None:
    """Base64 is read strictly: a value with a character outside the alphabet is not
    decoded with that character dropped (which would accept a damaged certificate)."""
    from test_status import NS, _b64, _pki

    damaged = _b64(_pki()["ca"].cert_pem)
    damaged = damaged[:8] + "*" + damaged[8:]
    ready = _certs_ready_with(_secret_data(ca_crt=damaged))
    assert (ready["status"], ready["message"]) == (
        "False",
        f"Secret {NS}/{NAMES.registry_secret} lacks ca.crt (not base64-encoded UTF-8 text)",
    )


def test_an_object_that_lost_one_of_our_labels_expects_only_that_one() -> None:
    """The relabelled text names only the labels of ours that are wrong; the one the object
    still has right is listed under ``has``, not as expected."""
    obs = dataclasses.replace(
        observed(with_changes(ds=None)),
        relabelled={
            ("DaemonSet", NAMES.node_driver): {n.LABEL_PART_OF: n.PART_OF, n.LABEL_INSTANCE: "x"}
        },
    )
    from test_status import cond

    deployed = cond(st.compute_status(obs, NOW), "DriverDeployed")
    assert deployed["reason"] == "ObjectsRelabelled"
    assert deployed["message"] == (
        "Relabelled (no longer selected as part of this deployment): "
        f"DaemonSet/{NAMES.node_driver} (expected {n.LABEL_INSTANCE}={NAMES.hyphened}; "
        f"has {n.LABEL_INSTANCE}=x, {n.LABEL_PART_OF}={n.PART_OF}); "
        "run `pulumi up --refresh` to restore the declared state"
    )


def test_a_relabelled_daemonset_makes_the_node_component_say_so() -> None:
    """The Node component of a DaemonSet that lost our labels says it is relabelled, not
    missing: the object is there, only no longer selected."""
    from test_status import NS

    obs = dataclasses.replace(
        observed(with_changes(ds=None)), relabelled={("DaemonSet", NAMES.node_driver): {}}
    )
    node = comp(st.compute_status(obs, NOW), "Node")
    assert (node["status"], node["reason"]) == (
        "NotReady",
        f"Node driver DaemonSet {NS}/{NAMES.node_driver} is relabelled "
        "(no longer selected as part of this deployment)",
    )


def test_a_nameless_failing_pod_is_named_as_a_question_mark_in_the_phase_reason() -> None:
    """A broken pod without a name (a garbage object in the cache) is shown as ``?`` in the
    Failed phase's reason, never as ``None``."""
    crashing = pod("x", "worker-0", ready=False, waiting="CrashLoopBackOff")
    del crashing["metadata"]["name"]
    s = st.compute_status(observed(with_changes(ds=daemonset(1, 0)), nodepods=[crashing]), NOW)
    assert s["phase"] == "Failed"
    assert s["reason"].startswith(
        "Node driver: pod ? on worker-0: CrashLoopBackOff (container pmem-driver); "
    )


# --------------------------------------------------------------------------- degraded node pods


def _finished(desired: int, ready: int, **ds: object) -> dict[str, dict[str, object]]:
    """The good objects with a DaemonSet whose rollout is finished (every pod updated)."""
    return with_changes(ds={**daemonset(desired, ready), **ds})


def test_no_node_pod_is_degraded_without_a_readable_daemonset_or_readable_pods() -> None:
    """Without a DaemonSet, with DaemonSets unreadable, or with pods unreadable (a stale
    cache) no pod is named as a broken node, whatever the cached pods show."""
    broken = [*node_pods(2), pod(BAD, "worker-2", ready=False)]
    assert [b.pod for b in st.degraded_node_pods(observed(_finished(3, 2), nodepods=broken))] == [
        BAD
    ]
    without = observed(with_changes(ds=None), nodepods=broken)
    assert st.degraded_node_pods(without) == []
    for kind in ("Pod", "DaemonSet"):
        unreadable = dataclasses.replace(
            observed(_finished(3, 2), nodepods=broken), unreadable={kind: "403 Forbidden"}
        )
        assert st.degraded_node_pods(unreadable) == [], kind


def test_no_node_pod_is_degraded_while_the_daemonset_lags_the_spec_or_its_generation() -> None:
    """A DaemonSet that does not carry the CR's spec yet, or whose controller has not seen its
    generation, is rolling out: its unready pods are on their way, not broken nodes. One that
    carries the current spec and is rolled out names them."""
    broken = [*node_pods(2), pod(BAD, "worker-2", ready=False)]
    spec = observed().cr["spec"]
    current = {"annotations": {n.SPEC_DIGEST_ANNOTATION: n.spec_digest(spec)}}
    old = {"annotations": {n.SPEC_DIGEST_ANNOTATION: n.spec_digest({**spec, "x": 1})}}

    def degraded(ds: dict[str, object]) -> list[str]:
        return [
            b.pod for b in st.degraded_node_pods(observed(with_changes(ds=ds), nodepods=broken))
        ]

    ds = daemonset(3, 2)
    assert degraded({**ds, "metadata": {**ds["metadata"], **current}}) == [BAD]
    assert degraded({**ds, "metadata": {**ds["metadata"], **old}}) == []
    assert degraded(daemonset(3, 2, generation=3, observed_generation=2)) == []


def test_degraded_node_pods_are_sorted_by_name_a_nameless_one_first_as_a_question_mark() -> None:
    """The broken node pods come sorted by name whatever the cache's order (the writer's
    Events and the tests rely on a stable order); a pod without a name is ``?`` and first."""
    names_ = ["pmem-c", "0-pod", "pmem-a"]
    pods = [pod(name, f"w-{name}", ready=False) for name in names_]
    nameless = pod("x", "w-x", ready=False)
    del nameless["metadata"]["name"]
    pods.insert(1, nameless)
    found = st.degraded_node_pods(observed(_finished(4, 0), nodepods=pods))
    assert [(b.pod, b.node) for b in found] == [
        ("?", "w-x"),
        ("0-pod", "w-0-pod"),
        ("pmem-a", "w-pmem-a"),
        ("pmem-c", "w-pmem-c"),
    ]


def test_a_ready_node_pod_being_deleted_is_degraded_as_terminating() -> None:
    """A ready pod with a deletionTimestamp is on its way out: its node is named, Terminating."""
    going = pod(BAD, "worker-2")
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    found = st.degraded_node_pods(observed(_finished(3, 3), nodepods=[*node_pods(2), going]))
    assert found == [st.BrokenPod(BAD, "worker-2", "Terminating")]


def test_tolerated_node_pods_at_the_edges_of_the_tolerance() -> None:
    """Exactly the tolerance (1 of 100) is tolerated; a single node pod that serves while an
    old one terminates is tolerated (0 unavailable); with no pod serving nothing is, even for
    a DaemonSet that selects no node any more."""
    from test_status_scale import NODE_DOWN, cluster

    objects, pods = cluster(100, {7: NODE_DOWN})
    assert st.tolerated_node_pods(observed(objects, nodepods=pods)) == {
        f"{NAMES.hyphened}-node-00007"
    }
    going = pod(BAD, "worker-2")
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    single = observed(_finished(1, 1), nodepods=[node_pods(1)[0], going])
    assert st.tolerated_node_pods(single) == {BAD}
    unselected = observed(_finished(0, 0), nodepods=[going])
    assert st.tolerated_node_pods(unselected) == frozenset()


def test_the_failed_reason_names_the_first_broken_pod_its_node_and_how_many_more() -> None:
    """A component that does not serve names its first broken pod by name, with its node
    (none for a pod not scheduled), and counts the other broken pods; a single broken pod
    gets no count."""
    from test_status import statefulset

    ctrl = f"{NAMES.controller_driver}-0"
    unplaced = pod(ctrl, None, unschedulable="0/3 nodes are available")
    s = st.compute_status(observed(with_changes(ss=statefulset(1, 0)), ctrl_pods=[unplaced]), NOW)
    assert s["reason"] == (
        f"Controller driver: pod {ctrl}: Unschedulable: 0/3 nodes are available; "
        "Controller driver is NotReady: Waiting for stateful set to be ready: "
        "0 of 1 replicas are ready"
    )
    for count, more in ((2, " (and 1 more failing pod(s))"), (3, " (and 2 more failing pod(s))")):
        pods = [
            pod(f"{BAD}-{i}", f"worker-{i}", ready=False, waiting="CrashLoopBackOff")
            for i in reversed(range(count))
        ]
        s = st.compute_status(observed(with_changes(ds=daemonset(count, 0)), nodepods=pods), NOW)
        assert s["reason"].startswith(
            f"Node driver: pod {BAD}-0 on worker-0: CrashLoopBackOff (container pmem-driver)"
            f"{more}; Node driver is NotReady: "
        ), s["reason"]


# --------------------------------------------------------------------------- broken or on its way


def test_a_terminating_pod_is_never_a_failure_whatever_its_containers_say() -> None:
    """A pod being deleted is on its way out: its crash loop is not a failure, so a
    DaemonSet whose every pod is terminating in a crash loop is Progressing, not Failed."""
    going = [
        pod(f"{BAD}-{i}", f"worker-{i}", ready=False, waiting="CrashLoopBackOff") for i in range(2)
    ]
    for p in going:
        p["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert [st.pod_failure(p) for p in going] == [None, None]
    s = st.compute_status(observed(with_changes(ds=daemonset(2, 0)), nodepods=going), NOW)
    assert st.failing_pods(observed(with_changes(ds=daemonset(2, 0)), nodepods=going)) == set()
    assert s["phase"] == "Progressing"


def test_a_pod_in_phase_failed_is_a_failure_even_without_a_container_reason() -> None:
    """An evicted pod (phase Failed, no container waiting) needs a person: a failure."""
    evicted = _pod("Failed", reason="Evicted", containerStatuses=[_cs("c", {"terminated": {}})])
    assert st.pod_failure(evicted) == "Failed: Evicted"
    assert st.pod_failure(_pod("Succeeded", containerStatuses=[_cs("c")])) is None


def test_an_init_container_that_cannot_pull_its_image_is_a_failure() -> None:
    """The init containers count: a pod stuck on an init container's image pull is broken."""
    stuck = _pod(
        "Pending",
        initContainerStatuses=[_cs("init", {"waiting": {"reason": "ImagePullBackOff"}})],
        containerStatuses=[_cs("c", {"waiting": {"reason": "PodInitializing"}})],
    )
    assert st.pod_failure(stuck) == "ImagePullBackOff (container init)"


# --------------------------------------------------------------------------- time zones


@pytest.fixture
def local_zone_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone set to UTC+05:30 (``TZ``), and put back afterwards:
    the reporter's times must not depend on the zone of the machine it runs on."""
    import time

    monkeypatch.setenv("TZ", "IST-05:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_zone_not_utc")
def test_status_times_are_utc_whatever_the_local_time_zone() -> None:
    """metav1.Time is UTC: a naive time counts as UTC and an aware one is converted, not
    relabelled, both in ``format_time`` and in the status's ``lastUpdated``."""
    naive = dt.datetime(2026, 12, 2, 10, 0, 0)
    plus_two = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert st.format_time(naive) == "2026-12-02T10:00:00Z"
    assert st.format_time(plus_two) == "2026-12-02T10:00:00Z"
    now = NOW.replace(tzinfo=None)
    s = st.compute_status(observed(), now)
    assert (s["phase"], s["lastUpdated"]) == ("Running", _stamp(NOW))
    at_plus_two = NOW.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert st.compute_status(observed(), at_plus_two)["lastUpdated"] == _stamp(NOW)


# ------------------------------------------------------------------ CertsReady, CertsVerified


def test_certs_ready_names_each_problem_secret_and_missing_outranks_a_missing_key() -> None:
    """Both Secrets are checked, even after the first is missing, and each problem is named;
    the reason is SecretMissing as soon as one Secret does not exist, whichever comes first.
    Every verdict (Unknown, False, True) records the generation it saw."""
    from test_status import NS, SECRET, cond, good_objects, secret

    reg, node = NAMES.registry_secret, NAMES.node_secret
    cases = {
        "both missing": (
            None,
            None,
            f"Secret {NS}/{reg} does not exist; Secret {NS}/{node} does not exist",
        ),
        "missing, then lacking": (
            None,
            secret(node, "node", drop="tls.key"),
            f"Secret {NS}/{reg} does not exist; Secret {NS}/{node} lacks tls.key",
        ),
        "lacking, then missing": (
            secret(reg, "registry", drop="ca.crt"),
            None,
            f"Secret {NS}/{reg} lacks ca.crt; Secret {NS}/{node} does not exist",
        ),
    }
    for case, (registry, node_secret, message) in cases.items():
        objects = good_objects()
        objects[SECRET][reg] = registry
        objects[SECRET][node] = node_secret
        ready = cond(st.compute_status(observed(objects), NOW), "CertsReady")
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "False",
            "SecretMissing",
            message,
        ), case
        assert ready["observedGeneration"] == 4, case
    good = cond(st.compute_status(observed(), NOW), "CertsReady")
    assert (good["status"], good["reason"], good["observedGeneration"]) == (
        "True",
        "SecretsComplete",
        4,
    )
    unreadable = dataclasses.replace(observed(), unreadable={"Secret": "403 Forbidden"})
    s = st.compute_status(unreadable, NOW)
    assert cond(s, "CertsReady")["observedGeneration"] == 4
    not_ready = cond(s, "CertsVerified")
    assert (not_ready["status"], not_ready["observedGeneration"]) == ("Unknown", 4)


def test_unreadable_secrets_name_both_secrets_and_the_error() -> None:
    """The Unknown CertsReady names the two Secrets it could not read and why."""
    from test_status import NS, cond

    unreadable = dataclasses.replace(observed(), unreadable={"Secret": "403 Forbidden"})
    ready = cond(st.compute_status(unreadable, NOW), "CertsReady")
    assert ready["message"] == (
        f"Secrets {NS}/{NAMES.registry_secret} and {NS}/{NAMES.node_secret} "
        "could not be read: 403 Forbidden"
    )


def test_a_crashed_certificate_check_shows_the_exception_type_and_first_line_only() -> None:
    """The Unknown CertsVerified of a crashing verifier names the exception's type and its
    first line (never what follows: key material could be in it), cut to 200 characters;
    an exception without a message shows its type alone."""
    from test_status import cond

    def raising(exc: Exception) -> Callable[..., list[object]]:
        def verify(*_: object, **__: object) -> list[object]:
            raise exc

        return verify

    cases = {
        "first line": (RuntimeError("boom\n-----BEGIN PRIVATE KEY-----"), "RuntimeError: boom"),
        "no message": (ValueError(), "ValueError: "),
        "long": (KeyError("k" * 300), "KeyError: '" + "k" * (200 - len("KeyError: '"))),
    }
    for case, (exc, detail) in cases.items():
        verified = cond(
            st.compute_status(observed(), NOW, verify_certs=raising(exc)), "CertsVerified"
        )
        assert (verified["status"], verified["reason"], verified["message"]) == (
            "Unknown",
            "VerificationFailed",
            f"Certificate check could not run: {detail}",
        ), case
        assert verified["observedGeneration"] == 4, case


def test_verified_certificates_say_what_was_checked_and_a_warning_records_the_generation() -> None:
    """CertsVerified True says what the check covered; True with a warning (a certificate
    expiring soon) records the generation it saw like every other verdict."""
    from test_status import _node_secret_with, cond

    valid = cond(st.compute_status(observed(), NOW), "CertsVerified")
    assert (valid["reason"], valid["message"]) == (
        "CertsValid",
        "Certificates are valid, chain to ca.crt and complete a mutual TLS handshake",
    )
    warned = cond(
        st.compute_status(observed(_node_secret_with("short_node")), NOW), "CertsVerified"
    )
    assert (warned["status"], warned["reason"], warned["observedGeneration"]) == (
        "True",
        "ExpiringSoon",
        4,
    )


# ------------------------------------------------------------------------------ DriverDeployed


def test_driver_deployed_lists_missing_relabelled_and_changed_objects_in_that_order() -> None:
    """One message names every missing object, every relabelled one and the changed ones
    (three in full; a count only beyond three), then the remedy; the reason is the first of
    missing, relabelled, changed; the verdict records the generation it saw."""
    from test_status import _edited, cond, good_objects

    objects = good_objects()
    objects["Role"][NAMES.provisioner_role] = None
    objects["CSIDriver"][NAMES.csi_driver] = None
    objects["Service"][NAMES.controller_service] = None
    objects["Service"][NAMES.metrics_service] = None
    edited = [
        ("ServiceAccount", NAMES.service_account),
        ("ClusterRole", NAMES.provisioner_cluster_role),
        ("ClusterRoleBinding", NAMES.provisioner_cluster_role_binding),
    ]
    for kind, name in edited:
        objects[kind][name] = _edited(objects[kind][name], "kubectl-edit", {"f:spec": {}})
    relabelled = {("Service", NAMES.controller_service): {}, ("Service", NAMES.metrics_service): {}}
    o = dataclasses.replace(observed(objects), relabelled=relabelled)
    deployed = cond(st.compute_status(o, NOW), "DriverDeployed")
    ours = f"expected {n.LABEL_INSTANCE}={NAMES.hyphened}, {n.LABEL_PART_OF}={n.PART_OF}; has none"
    changed = "; ".join(f"{kind}/{name} by kubectl-edit (spec)" for kind, name in edited)
    assert (deployed["status"], deployed["reason"], deployed["observedGeneration"]) == (
        "False",
        "ObjectsMissing",
        4,
    )
    assert deployed["message"] == (
        f"Missing Role/{NAMES.provisioner_role}, CSIDriver/{NAMES.csi_driver}; "
        "Relabelled (no longer selected as part of this deployment): "
        f"Service/{NAMES.controller_service} ({ours}); Service/{NAMES.metrics_service} ({ours}); "
        f"Changed behind Pulumi's back: {changed}; "
        "run `pulumi up --refresh` to restore the declared state"
    )
    # A fourth changed object is counted, not named (in the order of expected_objects).
    objects["RoleBinding"][NAMES.provisioner_role_binding] = _edited(
        objects["RoleBinding"][NAMES.provisioner_role_binding], "kubectl-edit", {"f:spec": {}}
    )
    o = dataclasses.replace(observed(objects), relabelled=relabelled)
    message = cond(st.compute_status(o, NOW), "DriverDeployed")["message"]
    first_three = [edited[0], ("RoleBinding", NAMES.provisioner_role_binding), edited[1]]
    listed = "; ".join(f"{kind}/{name} by kubectl-edit (spec)" for kind, name in first_three)
    assert f"Changed behind Pulumi's back: {listed}; and 1 more; run `pulumi up" in message


def test_unreadable_kinds_are_each_named_with_their_error_sorted_by_kind() -> None:
    """DriverDeployed Unknown names each kind it could not read with its error, sorted by
    kind, and records the generation it saw; all objects readable and present says how
    many there are."""
    from test_status import cond

    o = dataclasses.replace(
        observed(), unreadable={"Service": "401 Unauthorized", "CSIDriver": "403 Forbidden"}
    )
    deployed = cond(st.compute_status(o, NOW), "DriverDeployed")
    assert deployed == {
        "type": "DriverDeployed",
        "status": "Unknown",
        "reason": "ObjectsUnreadable",
        "message": "CSIDriver objects could not be read: 403 Forbidden; "
        "Service objects could not be read: 401 Unauthorized",
        "observedGeneration": 4,
        "lastTransitionTime": _stamp(NOW),
    }
    good = cond(st.compute_status(observed(), NOW), "DriverDeployed")
    assert good["message"] == "All 12 driver objects exist, changed by no one but Pulumi"


# ------------------------------------------------------------------------------ components


def test_an_unreadable_workload_is_not_ready_names_the_error_and_never_times_out() -> None:
    """A DaemonSet or StatefulSet that could not be read leaves its component NotReady with
    the error as the reason; nothing is known, so an hour later it is still Progressing."""
    for kind, component in (("DaemonSet", "Node"), ("StatefulSet", "Controller")):
        o = dataclasses.replace(observed(), unreadable={kind: "403 Forbidden"})
        first = st.compute_status(o, NOW)
        assert comp(first, component)["status"] == "NotReady", kind
        assert comp(first, component)["reason"] == f"{kind}s could not be read: 403 Forbidden"
        later = dataclasses.replace(o, cr={**o.cr, "status": first})
        s = st.compute_status(later, NOW + dt.timedelta(hours=1))
        assert s["phase"] == "Progressing", (kind, s["reason"])


def test_one_serving_node_pod_makes_crash_loops_elsewhere_progress_not_failure() -> None:
    """One node pod ready is enough to serve: two crash-looping pods beside it are progress
    (Progressing), not a component that does not serve (Failed)."""
    pods = [node_pods(1)[0]] + [
        pod(f"{BAD}-{i}", f"worker-{i}", ready=False, waiting="CrashLoopBackOff") for i in (1, 2)
    ]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 1)), nodepods=pods), NOW)
    assert s["phase"] == "Progressing", s["reason"]


def test_a_lagging_daemonset_whose_pods_all_crash_fails_at_once_naming_lag_and_pods() -> None:
    """A DaemonSet behind its generation whose every pod crash-loops does not serve: Failed
    at once; the Node reason is the lag, then each pod."""
    ds = daemonset(2, 0, generation=3, observed_generation=2)
    pods = [
        pod(f"{BAD}-{i}", f"worker-{i}", ready=False, waiting="CrashLoopBackOff") for i in (0, 1)
    ]
    s = st.compute_status(observed(with_changes(ds=ds), nodepods=pods), NOW)
    assert s["phase"] == "Failed"
    assert s["reason"].startswith(f"Node driver: pod {BAD}-0 on worker-0: CrashLoopBackOff")
    assert comp(s, "Node")["reason"] == (
        f"Rollout in progress: DaemonSet {NAMES.node_driver} has not observed generation 3 yet "
        f"(observed 2); {BAD}-0 on worker-0: CrashLoopBackOff (container pmem-driver); "
        f"{BAD}-1 on worker-1: CrashLoopBackOff (container pmem-driver)"
    )


def test_node_component_texts_with_no_node_selected_and_with_tolerated_pods() -> None:
    """The Ready reasons of a DaemonSet that selects no node, and of a finished rollout with
    broken pods within the tolerance: the counts, then each broken pod."""
    from test_status_scale import NODE_DOWN, cluster

    s = st.compute_status(observed(with_changes(ds=daemonset(0)), nodepods=[]), NOW)
    assert comp(s, "Node")["reason"] == "No node is selected for the node driver (0 pods needed)"
    objects, pods = cluster(200, {3: NODE_DOWN, 9: NODE_DOWN})
    node = comp(st.compute_status(observed(objects, nodepods=pods), NOW), "Node")
    assert (node["status"], node["reason"]) == (
        "Ready",
        "198 of 200 node driver pod(s) ready, 2 not (up to 2 tolerated); "
        f"{NAMES.hyphened}-node-00003 on node-00003: container(s) pmem-driver not ready; "
        f"{NAMES.hyphened}-node-00009 on node-00009: container(s) pmem-driver not ready",
    )


def _ctrl(ss: dict[str, object], pods: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The status of the good objects with this StatefulSet (and these controller pods)."""
    return st.compute_status(observed(with_changes(ss=ss), ctrl_pods=pods), NOW)


def test_a_relabelled_statefulset_makes_the_controller_component_say_so() -> None:
    """The Controller component of a StatefulSet that lost our labels says it is relabelled."""
    from test_status import NS

    obs = dataclasses.replace(
        observed(with_changes(ss=None)),
        relabelled={("StatefulSet", NAMES.controller_driver): {n.LABEL_PART_OF: n.PART_OF}},
    )
    ctrl = comp(st.compute_status(obs, NOW), "Controller")
    assert ctrl["reason"] == (
        f"Controller driver StatefulSet {NS}/{NAMES.controller_driver} is relabelled "
        "(no longer selected as part of this deployment)"
    )


def test_a_lagging_statefulset_whose_pod_crashes_fails_at_once_naming_lag_and_pod() -> None:
    """A StatefulSet behind its generation, named by kind, whose only pod crash-loops does
    not serve: Failed at once; the Controller reason is the lag, then the pod."""
    from test_status import statefulset

    ctrl = f"{NAMES.controller_driver}-0"
    ss = statefulset(1, 0, generation=5, observed_generation=4)
    s = _ctrl(ss, [pod(ctrl, "worker-1", ready=False, waiting="CrashLoopBackOff")])
    assert s["phase"] == "Failed"
    assert s["reason"].startswith(f"Controller driver: pod {ctrl} on worker-1: CrashLoopBackOff")
    assert comp(s, "Controller")["reason"] == (
        f"Rollout in progress: StatefulSet {NAMES.controller_driver} has not observed "
        f"generation 5 yet (observed 4); {ctrl} on worker-1: CrashLoopBackOff (container "
        "pmem-driver)"
    )


def test_a_statefulset_without_replicas_wants_one() -> None:
    """``spec.replicas`` absent means one replica (the API's default)."""
    from test_status import statefulset

    ss = statefulset(1, 0)
    del ss["spec"]["replicas"]
    assert comp(_ctrl(ss), "Controller")["reason"].startswith(
        "Waiting for stateful set to be ready: 0 of 1 replicas are ready"
    )
    ss = statefulset(1, 1)
    del ss["spec"]["replicas"]
    assert comp(_ctrl(ss), "Controller")["reason"] == (
        "1 instance(s) of controller driver is running successfully"
    )


def test_one_ready_controller_makes_a_crashing_second_pod_progress_not_failure() -> None:
    """A ready controller serves: a crash-looping second replica is progress (Progressing)."""
    from test_status import statefulset

    pods = [
        pod(f"{NAMES.controller_driver}-0", "worker-0"),
        pod(f"{NAMES.controller_driver}-1", "worker-1", ready=False, waiting="CrashLoopBackOff"),
    ]
    s = _ctrl(statefulset(2, 1), pods)
    assert s["phase"] == "Progressing", s["reason"]


def test_an_on_delete_statefulset_waits_for_its_pods_at_the_current_revision() -> None:
    """Without a RollingUpdate strategy (OnDelete) nothing is rolled out by the controller:
    no "updated" count, but pods not at the current revision keep the Controller NotReady.
    A strategy without a type is a RollingUpdate (the API's default)."""
    from test_status import statefulset

    ss = statefulset(2, 2, updated=1, update_revision="ctrl-2")
    ss["spec"]["updateStrategy"] = {"type": "OnDelete"}
    ss["status"]["currentReplicas"] = 1
    ctrl = comp(_ctrl(ss), "Controller")
    assert (ctrl["status"], ctrl["reason"]) == (
        "NotReady",
        "1 of 2 controller pod(s) at the current revision",
    )
    untyped = statefulset(1, 1, updated=0, update_revision="ctrl-2")
    untyped["spec"]["updateStrategy"] = {}
    assert comp(_ctrl(untyped), "Controller")["reason"] == (
        "Rollout in progress: 0 of 1 controller pod(s) updated"
    )


def test_a_rollout_paused_by_a_partition_at_the_replica_count_is_done() -> None:
    """A partition at (or above) the replica count updates no pod by design: nothing is
    waited for, the Controller is Ready."""
    from test_status import statefulset

    ss = statefulset(2, 2, updated=0, update_revision="ctrl-2")
    ss["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    ctrl = comp(_ctrl(ss), "Controller")
    assert (ctrl["status"], ctrl["reason"]) == (
        "Ready",
        "2 instance(s) of controller driver is running successfully",
    )


def test_extra_controller_pods_and_unready_replicas_are_both_named() -> None:
    """Each thing the Controller waits for is named, joined by ``; ``; the revision count is
    not added when something else is already waited for."""
    from test_status import statefulset

    ss = statefulset(2, 1)
    ss["status"].update({"replicas": 3, "currentReplicas": 1})
    assert comp(_ctrl(ss), "Controller")["reason"] == (
        "Waiting for 1 extra pod(s) to terminate; "
        "Waiting for stateful set to be ready: 1 of 2 replicas are ready"
    )
    ss = statefulset(2, 2)
    ss["status"].update({"replicas": 3, "currentReplicas": 1})
    assert comp(_ctrl(ss), "Controller")["reason"] == "Waiting for 1 extra pod(s) to terminate"


def test_running_with_tolerated_node_pods_says_so_in_the_phase_reason() -> None:
    """Running with broken node pods within the tolerance adds the Node component's count
    (its first part, not the pods) to the phase reason."""
    from test_status_scale import NODE_DOWN, cluster

    objects, pods = cluster(200, {3: NODE_DOWN, 9: NODE_DOWN})
    s = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert (s["phase"], s["reason"]) == (
        "Running",
        "All driver components are deployed successfully; "
        "Node driver: 198 of 200 node driver pod(s) ready, 2 not (up to 2 tolerated)",
    )


def test_dropping_implausible_times_leaves_the_observed_status_untouched() -> None:
    """The cleaned copy is a copy: the CR's status in the cache (which the writer compares
    with) keeps its timestamps, garbage included."""
    old = {
        "conditions": [{"type": "A", "status": "True", "lastTransitionTime": "garbage"}],
        "driverComponents": [{"component": "Node", "lastUpdated": "garbage"}],
    }
    kept = st.without_implausible_times(old, {"metadata": {}}, NOW)
    assert "lastTransitionTime" not in kept["conditions"][0]
    assert "lastUpdated" not in kept["driverComponents"][0]
    assert old["conditions"][0]["lastTransitionTime"] == "garbage"
    assert old["driverComponents"][0]["lastUpdated"] == "garbage"


def test_a_time_up_to_one_clock_skew_before_the_crs_creation_is_kept() -> None:
    """A replica's clock may lag the API server's: a time up to the clock skew before the
    CR's creationTimestamp is plausible; further before, it is dropped."""
    created = NOW - dt.timedelta(hours=1)
    cr = {"metadata": {"creationTimestamp": _stamp(created)}}
    at_limit = _stamp(created - dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS))
    beyond = _stamp(created - dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS + 1))
    old = {
        "conditions": [
            {"type": "A", "status": "True", "lastTransitionTime": at_limit},
            {"type": "B", "status": "True", "lastTransitionTime": beyond},
        ]
    }
    kept = st.without_implausible_times(old, cr, NOW)
    assert kept["conditions"][0]["lastTransitionTime"] == at_limit
    assert "lastTransitionTime" not in kept["conditions"][1]


def test_a_workload_without_the_crs_spec_is_named_by_kind_and_name() -> None:
    """The rollout text of a workload that does not carry the CR's spec yet names it by
    kind and name and says which generation of the spec it lacks."""
    from test_status import statefulset

    spec = observed().cr["spec"]
    old = {n.SPEC_DIGEST_ANNOTATION: n.spec_digest({**spec, "x": 1})}
    ds, ss = daemonset(3), statefulset(1)
    ds["metadata"]["annotations"] = old
    ss["metadata"]["annotations"] = old
    s = st.compute_status(observed(with_changes(ds=ds, ss=ss)), NOW)
    for component, kind, name in (
        ("Node", "DaemonSet", NAMES.node_driver),
        ("Controller", "StatefulSet", NAMES.controller_driver),
    ):
        assert comp(s, component)["reason"].startswith(
            f"Rollout in progress: {kind} {name} does not carry generation 4 of the spec yet"
        ), component


def test_a_time_with_a_lowercase_z_is_garbage_and_not_carried() -> None:
    """metav1.Time is written and read with an upper-case ``Z`` (Go's RFC 3339 layout): a
    Go client cannot parse ``...z``, so such a time from another writer is dropped (and
    written over), not carried."""
    lower = _stamp(NOW).replace("Z", "z")
    old = {"conditions": [{"type": "A", "status": "True", "lastTransitionTime": lower}]}
    kept = st.without_implausible_times(old, {"metadata": {}}, NOW)
    assert "lastTransitionTime" not in kept["conditions"][0]

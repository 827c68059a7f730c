"""The reporter's status rules (:mod:`reporter.status`): cases that mutation testing found
open in test_status.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

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

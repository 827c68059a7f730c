"""Small fixes of the status rules (``reporter/status.py``): odd pods from the API or a cache
(two of one name, one without a name, a name that is not a string) are reported, never a
crash of the reconcile, and the text does not depend on the cache's order."""

from __future__ import annotations

from typing import Any

import pytest
from test_status import NOW, comp, daemonset, node_pods, observed, pod, with_changes

from reporter import status as st


def _named(name: Any, node: str | None, **kw: Any) -> dict[str, Any]:
    """A test pod whose metadata.name is ``name`` as given (None, an int), not a string."""
    p = pod("x", node, **kw)
    p["metadata"]["name"] = name
    return p


def _node_reason(pods: list[dict[str, Any]], ds: dict[str, Any]) -> tuple[str, str]:
    """The Node component's reason and the phase's, for these node pods."""
    s = st.compute_status(observed(with_changes(ds=ds), nodepods=pods), NOW)
    return comp(s, "Node")["reason"], s["reason"]


def test_two_failing_pods_of_one_name_are_both_counted_in_any_order() -> None:
    """A cache holding two failing pods of one name (a pod replaced under its name, seen
    twice): ``_failing_pods`` sorted (name, pod) pairs, compared the two pods' dicts and
    raised TypeError."""
    pods = [
        pod("pmem-node-a", "w2", ready=False, waiting="ImagePullBackOff"),
        pod("pmem-node-a", "w1", ready=False, waiting="CrashLoopBackOff"),
    ]
    node, phase = _node_reason(pods, daemonset(2, 0))
    assert "pod pmem-node-a on w1: CrashLoopBackOff" in phase
    assert "(and 1 more failing pod(s))" in phase
    assert _node_reason(pods[::-1], daemonset(2, 0)) == (node, phase)


@pytest.mark.parametrize("name", [None, 7], ids=["null-name", "int-name"])
def test_a_failing_pod_without_a_string_name_is_reported_not_a_crash(name: Any) -> None:
    """metadata.name null or a number beside a named pod: every sort by name compared None
    or an int with a str and raised TypeError (``_failing_pods``, ``_describe_pods``,
    ``degraded_node_pods``)."""
    odd = _named(name, "w9", ready=False, waiting="CrashLoopBackOff")
    named = pod("pmem-node-b", "w1", ready=False, waiting="CrashLoopBackOff")
    node, phase = _node_reason([odd, named], daemonset(2, 0))
    shown = "?" if name is None else str(name)
    assert f"{shown} on w9: CrashLoopBackOff" in node
    assert "(and 1 more failing pod(s))" in phase
    assert _node_reason([named, odd], daemonset(2, 0)) == (node, phase)
    assert st.failing_pods(observed(nodepods=[odd, named])) == {shown, "pmem-node-b"}


def test_broken_node_pods_without_a_name_or_of_one_name_come_in_a_stable_order() -> None:
    """The writer names broken node pods in Events in ``degraded_node_pods``' order: a
    null name raised TypeError, and two pods of one name came in the cache's order."""
    twins = [
        pod("pmem-node-a", "w2", ready=False),
        pod("pmem-node-a", None, ready=False),
        _named(None, "w9", ready=False),
    ]
    objects = with_changes(ds=daemonset(4, 1))
    found = st.degraded_node_pods(observed(objects, nodepods=[*node_pods(1), *twins]))
    assert [(b.pod, b.node) for b in found] == [
        ("?", "w9"),
        ("pmem-node-a", None),
        ("pmem-node-a", "w2"),
    ]
    again = st.degraded_node_pods(observed(objects, nodepods=[*twins[::-1], *node_pods(1)]))
    assert again == found

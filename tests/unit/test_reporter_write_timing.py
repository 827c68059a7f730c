"""What is written at once and what waits: exactly the list in docs/reporter.md.

docs/reporter.md ("## The status the reporter writes"): written at once -- phase Failed entered
or left, a condition's status or reason, observedGeneration, a pod starting or ceasing to fail,
and the first Running after a failure or after failing pods healed; through the per-CR budget (3
at once, then one per ``--message-interval``) -- Running <-> Progressing, a component's Ready
<-> NotReady, and message text. Each case runs with the budget used up, so "at once" and "waits"
are told apart.
"""

from __future__ import annotations

import pytest
from test_reporter_write import NAME, setup


def cond(status: str = "True", reason: str = "R", message: str = "m") -> dict:
    return {"type": "CertsReady", "status": status, "reason": reason, "message": message}


def comp(status: str = "Ready", reason: str = "all") -> dict:
    return {"component": "Node", "status": status, "reason": reason}


def st(phase="Progressing", gen=1, c=None, k=None, reason="r") -> dict:
    return {
        "phase": phase,
        "reason": reason,
        "observedGeneration": gen,
        "conditions": [c or cond()],
        "driverComponents": [k or comp()],
    }


CASES = [
    # (id, before, after, written at once?)
    ("failed-entered", st("Progressing"), st("Failed"), True),
    ("failed-left", st("Failed"), st("Progressing"), True),
    ("condition-status", st(c=cond("True")), st(c=cond("False")), True),
    ("condition-reason", st(c=cond(reason="A")), st(c=cond(reason="B")), True),
    ("generation", st(gen=1), st(gen=2), True),
    ("running-to-progressing", st("Running"), st("Progressing"), False),
    ("progressing-to-running", st("Progressing"), st("Running"), False),
    ("component-flip", st(k=comp("Ready")), st(k=comp("NotReady")), False),
    ("component-text", st(k=comp(reason="1 of 9")), st(k=comp(reason="2 of 9")), False),
    ("condition-message", st(c=cond(message="a")), st(c=cond(message="b")), False),
    ("phase-reason-text", st(reason="a"), st(reason="b"), False),
]


@pytest.mark.parametrize(
    ("before", "after", "at_once"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_written_at_once_or_through_the_budget(monkeypatch, before, after, at_once) -> None:
    cache, _api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    cache.crs[NAME]["status"] = before
    writer._tokens[NAME] = (0.0, clock[0])  # the budget is used up
    monkeypatch.setattr("reporter.write.status.compute_status", lambda *a, **k: dict(after))
    assert writer.reconcile(NAME) is at_once
    if not at_once:
        assert NAME in writer.deferred  # it waits, and is due within one interval
        assert writer.deferred[NAME] - clock[0] <= writer.message_interval
        clock[0] = writer.deferred[NAME]
        assert writer.reconcile(NAME)


def test_the_first_running_after_a_failure_is_written_at_once(monkeypatch) -> None:
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    phases = iter([st("Failed"), st("Progressing"), st("Running")])
    monkeypatch.setattr("reporter.write.status.compute_status", lambda *a, **k: next(phases))
    cache.crs[NAME]["status"] = st("Running")
    assert writer.reconcile(NAME)  # -> Failed
    writer._tokens[NAME] = (0.0, clock[0])
    assert writer.reconcile(NAME)  # -> Progressing: leaving Failed
    writer._tokens[NAME] = (0.0, clock[0])
    assert writer.reconcile(NAME)  # -> Running: the recovery, not a rollout
    assert [p["status"]["phase"] for p in api.patches] == ["Failed", "Progressing", "Running"]


def test_a_pod_starting_or_ceasing_to_fail_is_written_at_once(monkeypatch) -> None:
    """One crash loop of many changes no phase any more (progress, or tolerated), yet it is
    what an administrator waits for: at once, and so is the Running after it healed."""
    from reporter import status as status_mod

    _cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    failing = [frozenset()]
    monkeypatch.setattr(status_mod, "failing_pods", lambda observed: failing[0])
    steps = iter(
        [
            (st("Running"), frozenset()),
            (st("Progressing", k=comp("NotReady", "pod-1: CrashLoopBackOff")), {"pod-1"}),
            (st("Progressing", k=comp("NotReady", "pod-1: NotReady")), frozenset()),
            (st("Running"), frozenset()),
        ]
    )
    current = [None]

    def compute(*_a, **_k):
        return dict(current[0])

    monkeypatch.setattr("reporter.write.status.compute_status", compute)
    for new, now_failing in steps:
        current[0], failing[0] = new, frozenset(now_failing)
        writer._tokens[NAME] = (0.0, clock[0])  # the budget is used up every time
        assert writer.reconcile(NAME), new
    # Four writes (the third changes the Node reason only, so its patch holds no phase).
    assert [p["status"].get("phase") for p in api.patches] == [
        "Running",
        "Progressing",
        None,
        "Running",
    ]

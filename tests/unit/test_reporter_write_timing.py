"""What is written at once and what waits: exactly the list in the README's reporter section.

README ("## The status the reporter writes"): written at once -- phase Failed entered or left,
a condition's status or reason, observedGeneration, and the first Running after a failure;
through the per-CR budget (3 at once, then one per ``--message-interval``) -- Running <->
Progressing, a component's Ready <-> NotReady, and message text. Each case runs with the
budget used up, so "at once" and "waits" are told apart.
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

"""A status another writer filled with garbage is replaced by a clean one, timestamps included.

The end-to-end counterpart (the reporter overwriting a garbage status in the cluster) is
``tests/e2e/test_bad_input_and_leaks.py::test_reporter_overwrites_a_garbage_status_cleanly``.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from test_status import NOW, NOW_S, observed

from reporter import status as st

CREATED = NOW - dt.timedelta(days=1)


def garbage(**times: str) -> dict[str, Any]:
    """A status in the CRD's schema but wrong throughout; the same statuses as reality where
    the carry-over rules would otherwise keep the garbage's timestamps."""
    return {
        "phase": "Failed",
        "reason": "garbage",
        "observedGeneration": 999,
        "lastUpdated": "2999-01-01T00:00:00Z",
        "conditions": [
            {"type": "Bogus", "status": "Unknown", "reason": "Garbage", "message": "garbage"},
            {
                "type": "CertsReady",
                "status": "True",
                "reason": "Garbage",
                "message": "garbage",
                "lastTransitionTime": times.get("certs", "2999-01-01T00:00:00Z"),
            },
            {
                "type": "DriverDeployed",
                "status": "True",
                "reason": "Garbage",
                "lastTransitionTime": times.get("deployed", "1970-01-01T00:00:00Z"),
            },
            {
                "type": "CertsVerified",
                "status": "True",
                "lastTransitionTime": times.get("verified", "not a time"),
            },
        ],
        "driverComponents": [
            {
                "component": "Node",
                "status": "Ready",
                "reason": "All 3 node driver pod(s) running successfully",
                "lastUpdated": times.get("node", "2999-01-01T00:00:00Z"),
            },
        ],
    }


def _observed(status: dict[str, Any]) -> Any:
    obs = observed(status=status)
    obs.cr.setdefault("metadata", {})["creationTimestamp"] = st.format_time(CREATED)
    return obs


def test_garbage_is_replaced_and_no_garbage_timestamp_is_carried() -> None:
    clean = st.compute_status(_observed({}), NOW)
    later = NOW + dt.timedelta(minutes=1)
    result = st.compute_status(_observed(garbage()), later)
    later_s = st.format_time(later)
    assert st.status_equal_ignoring_time(result, clean)
    assert "Garbage" not in repr(result) and "garbage" not in repr(result)
    assert [c["type"] for c in result["conditions"]] == list(st.CONDITION_TYPES)
    # Future, pre-creation and unparseable times are the reporter's own again.
    assert {c["lastTransitionTime"] for c in result["conditions"]} == {later_s}
    assert {c["lastUpdated"] for c in result["driverComponents"]} == {later_s}
    assert result["lastUpdated"] == later_s


def test_plausible_times_are_still_carried() -> None:
    """Only impossible times are dropped; a real earlier transition keeps its time."""
    stamps = {"certs": NOW_S, "deployed": NOW_S, "verified": NOW_S, "node": NOW_S}
    result = st.compute_status(_observed(garbage(**stamps)), NOW + dt.timedelta(minutes=1))
    assert {c["lastTransitionTime"] for c in result["conditions"]} == {NOW_S}
    node = next(c for c in result["driverComponents"] if c["component"] == "Node")
    assert node["lastUpdated"] == NOW_S


def test_small_clock_skew_is_tolerated() -> None:
    ahead = st.format_time(NOW + dt.timedelta(minutes=2))  # another replica's clock
    result = st.compute_status(_observed(garbage(certs=ahead)), NOW)
    assert (
        next(c for c in result["conditions"] if c["type"] == "CertsReady")["lastTransitionTime"]
        == ahead
    )


def test_garbage_only_in_timestamps_is_written_over() -> None:
    """Same meaning but impossible times: not "equal", so the writer patches them away."""
    clean = st.compute_status(_observed({}), NOW)
    garbage_times = copy.deepcopy(clean)
    garbage_times["conditions"][0]["lastTransitionTime"] = "2999-01-01T00:00:00Z"
    again = st.compute_status(_observed(garbage_times), NOW)
    assert not st.status_equal_ignoring_time(garbage_times, again)
    assert again["conditions"][0]["lastTransitionTime"] == NOW_S
    # Once clean, the same status is "equal" again: no write loop.
    assert st.status_equal_ignoring_time(again, st.compute_status(_observed(again), NOW))
    unparseable = copy.deepcopy(clean)
    unparseable["driverComponents"][0]["lastUpdated"] = "yesterday"
    assert not st.status_equal_ignoring_time(unparseable, clean)


def test_a_replica_clock_slightly_ahead_causes_no_write_loop() -> None:
    ahead = copy.deepcopy(st.compute_status(_observed({}), NOW + dt.timedelta(minutes=2)))
    again = st.compute_status(_observed(ahead), NOW)
    assert st.status_equal_ignoring_time(ahead, again)


def test_a_removed_timestamp_is_written_back() -> None:
    clean = st.compute_status(_observed({}), NOW)
    stripped = copy.deepcopy(clean)
    del stripped["conditions"][1]["lastTransitionTime"]
    assert not st.status_equal_ignoring_time(stripped, clean)

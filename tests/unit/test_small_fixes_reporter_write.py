"""Small fixes of the status writer (``reporter/write.py``): Events held back go back to
their queue oldest first, and a phase Event names the CR whatever the patch's reply holds."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from test_reporter_write import NAME, FakeStatusApi, setup

from reporter import write


def _refusing(api: FakeStatusApi, refusals: list[ApiException]) -> None:
    """Refuse the next Events with ``refusals`` (one each, in order), then accept them."""
    create = FakeStatusApi.create_event

    def create_event(namespace: str, event: dict) -> dict:
        if refusals:
            raise refusals.pop(0)
        return create(api, namespace, event)

    api.create_event = create_event  # type: ignore[method-assign]


def _retry_now() -> ApiException:
    """A 429 whose Retry-After is 0: transient, and the writer waits no time before the next
    attempt."""
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": "0"}
    return exc


def test_two_held_back_events_refused_again_in_one_flush_keep_their_order() -> None:
    """Both Events of a CR refused, then both refused again in one flush with no delay: the
    second went back to the head of the queue in front of the first, so the API server got
    them newest first."""
    cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    _refusing(api, [_retry_now() for _ in range(4)])
    cr = cache.crs[NAME]
    writer._record(cr, "Warning", "NodeDriverNotReady", "older")
    writer._record(cr, "Warning", "Failed", "newer")
    assert [e["message"] for e, *_ in writer._pending_events[NAME]] == ["older", "newer"]
    writer._flush_events(NAME)  # both refused again
    assert [e["message"] for e, *_ in writer._pending_events[NAME]] == ["older", "newer"]
    writer._flush_events(NAME)  # accepted
    assert [e["message"] for _, e in api.events] == ["older", "newer"]
    assert NAME not in writer._pending_events



def test_after_a_give_up_the_events_refused_again_in_one_flush_keep_their_order() -> None:
    """The oldest Event's minute is up (given up at the flush); the two behind it, refused
    again with no delay, go back to the queue in their order, and reach the API in it."""
    cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    _refusing(api, [_retry_now() for _ in range(5)])
    cr = cache.crs[NAME]
    writer._record(cr, "Warning", "Failed", "oldest")
    clock[0] = 30.0
    writer._record(cr, "Warning", "NodeDriverNotReady", "older")
    writer._record(cr, "Warning", "NodeDriversNotReady", "newer")
    clock[0] = write.EVENT_GIVE_UP_SECONDS
    writer._flush_events(NAME)  # "oldest" given up, the other two refused again
    assert [e["message"] for e, *_ in writer._pending_events[NAME]] == ["older", "newer"]
    writer._flush_events(NAME)
    assert [e["message"] for _, e in api.events] == ["older", "newer"]


def test_the_phase_event_names_the_cr_when_the_patch_reply_has_no_metadata() -> None:
    """An empty reply body reads as ``{}`` (``RawApi.request_json``): the phase Event was built
    from that reply, with no name and no uid (its own name ``None.<hex>``, which the API
    server refuses), so the Failed Event was lost."""
    _cache, api, writer, _ = setup()
    patch = api.patch_status

    def empty_reply(name: str, body: dict) -> dict:
        patch(name, body)  # applied; the reply's body is empty
        return {}

    api.patch_status = empty_reply  # type: ignore[method-assign]
    assert writer.reconcile(NAME)
    [(_, event)] = api.events
    assert event["reason"] == "Failed"
    assert (event["involvedObject"]["name"], event["involvedObject"]["uid"]) == (NAME, "u1")
    assert event["metadata"]["name"].startswith(f"{NAME}.")

"""Review of the change 48eb603..2fd9f23 (HTTP/2 watch fixes, program fixes): each test is a
neighbour of one of its fixes that the same guard missed."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_reporter_h2watch import CAP, POD, Server, raw_api, wait_for
from test_reporter_h2watch import tls_files as tls_files
from test_small_fixes_program import KEY, _patch_problems

from pmem_components.config import ConfigError, load_config

# --------------------------------------------------------------------------- renamedFrom


def test_two_deployments_renamed_from_the_same_old_one_are_refused() -> None:
    """A rename moves one deployment to one new name. Two entries with the same
    ``renamedFrom`` both got the old deployment as their ``Previous`` from the preflight:
    both components alias the old component's URN (and both bundles the old objects'), which
    the engine refuses as duplicate aliases in the middle of ``pulumi up``, and the old
    driver would be "replaced" twice. Refused with the other cross-entry rename rule."""
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "deployments": [
                    {"name": "a.example.com", "namespace": "a", "renamedFrom": "old.example.com"},
                    {"name": "b.example.com", "namespace": "b", "renamedFrom": "old.example.com"},
                ]
            },
            check_certificates=False,
        )
    assert info.value.problems == [
        'pmem-csi:deployments[1].renamedFrom: "old.example.com" is already renamed by '
        "pmem-csi:deployments[0].renamedFrom; a deployment is renamed to one new name, so "
        "set renamedFrom on one of them only"
    ]


# --------------------------------------------------------------------------- patched labels


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {
                "kind": "DaemonSet",
                "mergePatch": {"spec": {"template": {"spec": {"nodeSelector": {"zone": "a\n"}}}}},
            },
            f'{KEY}[0]: spec.template.spec.nodeSelector["zone"]: is not a valid label value '
            '(got "a\\n")',
        ),
        (
            {
                "kind": "DaemonSet",
                "mergePatch": {"spec": {"template": {"spec": {"nodeSelector": {"/z": "a"}}}}},
            },
            f'{KEY}[0]: spec.template.spec.nodeSelector["/z"]: is not a valid label key',
        ),
        (
            {
                "kind": "Service",
                "name": "first-example-com-metrics",
                "mergePatch": {"spec": {"selector": {"app": "v" * 64}}},
            },
            f'{KEY}[0]: spec.selector["app"]: is not a valid label value (got "{"v" * 64}")',
        ),
    ],
    ids=["node-selector-value", "node-selector-key", "service-selector-value"],
)
def test_a_patch_writing_a_selector_the_api_server_refuses_is_named(
    patch: dict[str, Any], expected: str
) -> None:
    """The API server checks a pod's nodeSelector and a Service's selector with the label
    rule (ValidateLabels), as it checks labels; the config's own nodeSelector is checked with
    it, but one written by a patch passed the dry run and failed in the middle of
    ``pulumi up``."""
    assert _patch_problems(patch) == [expected]


def test_valid_selectors_written_by_patches_are_accepted() -> None:
    """Prefixed keys and an empty value; a workload's ``spec.selector`` is a LabelSelector
    (an object, immutable and checked as a fixed field), not a label map."""
    ds = {
        "kind": "DaemonSet",
        "mergePatch": {
            "spec": {"template": {"spec": {"nodeSelector": {"example.com/zone": "", "z": "A"}}}}
        },
    }
    svc = {
        "kind": "Service",
        "name": "first-example-com-metrics",
        "mergePatch": {"spec": {"selector": {"example.com/x": "y"}}},
    }
    assert _patch_problems(ds, svc) == []


# --------------------------------------------------------------------------- HTTP/2 recovery


def test_a_watch_restarted_at_recovery_goes_over_a_new_connection_not_the_silent_one(
    tls_files: tuple[Path, Path],
) -> None:
    """At recovery the silent watches were closed before their silent connections: an
    informer resumes at once, and its new watch was placed on the silent connection that was
    still in the pool, which ``close_silent`` closed a moment later. The restarted watch
    failed as a transport error (a warning, a backoff, and a new "trouble" that restarts
    the watches again), the restart lost. The watches must still end quietly (3b458a7)."""
    server = Server(tls_files)
    try:
        api = raw_api(server, tls_files)
        first: list[Any] = []
        opener = threading.Thread(
            target=lambda: first.append(api.watch(POD, "1", "ns")), daemon=True
        )
        opener.start()
        silent_conn, sid, _, _ = server.request(0)
        silent_conn.respond(sid)
        opener.join(CAP)
        (watch,) = first
        restarted: list[Any] = []
        errors: list[BaseException] = []

        def informer() -> None:
            try:
                list(watch)  # ends quietly once closed at recovery
                restarted.append(api.watch(POD, "2", "ns"))  # resumes at once
            except BaseException as exc:
                errors.append(exc)

        reading = threading.Thread(target=informer, daemon=True)
        reading.start()
        drop = api.connectivity._on_recovered

        def drop_after_a_quick_informer(since: float) -> None:
            # An informer is quicker than the recovery's remaining work (hundreds of
            # watches to close, the HTTP/1.1 pools to clear): let its re-watch go first
            # when it can (it cannot when the connections are closed before the watches).
            with contextlib.suppress(AssertionError):
                _wait(lambda: len(server.requests) > 1, 1.0)
            drop(since)

        api.connectivity._on_recovered = drop_after_a_quick_informer
        api.connectivity.failed()
        time.sleep(0.01)
        api.connectivity.answered(time.monotonic())
        new_conn, new_sid, _, _ = server.request(1)
        new_conn.respond(new_sid)
        reading.join(CAP)
        assert errors == [], errors
        assert restarted and new_conn is not silent_conn
        wait_for(lambda: silent_conn.closed, "the silent connection closed")
    finally:
        server.close()


def _wait(cond: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)

"""Flags are checked at start with a message naming the flag (issue 16: --lease-duration)."""

from __future__ import annotations

import pytest

from reporter.__main__ import parse_args
from reporter.leader import LeaderElector
from reporter.write import CONFLICT_QUIET_SECONDS


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "2", "3"])
def test_a_lease_shorter_than_the_renew_period_allows_is_refused(capsys, value: str) -> None:
    err = refused(capsys, "--lease-duration", value)
    assert "--lease-duration" in err
    assert "at least 4" in err and "renews every 2 s" in err


@pytest.mark.parametrize("value", ["10.5", "4.9", "abc"])
def test_a_lease_duration_that_is_not_whole_seconds_is_refused(capsys, value: str) -> None:
    """leaseDurationSeconds is an integer: 4.9 would be written as 4, and another replica would
    take over while this one still believed it led (two leaders)."""
    err = refused(capsys, "--lease-duration", value)
    assert "--lease-duration" in err and "whole number of seconds" in err


def test_valid_lease_durations_are_accepted_as_integers() -> None:
    assert parse_args([]).lease_duration == 10
    assert parse_args(["--lease-duration", "4"]).lease_duration == 4
    assert parse_args(["--lease-duration", "15"]).lease_duration == 15


def test_the_elector_refuses_a_fractional_lease_too() -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        LeaderElector(None, "ns", "l", "me", lease_duration=4.9, renew_deadline=3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "flag",
    [
        "--resync-seconds",
        "--message-interval",
        "--progress-deadline-seconds",
        "--conflict-quiet-seconds",
    ],
)
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_period_that_is_not_a_positive_number_of_seconds_is_refused(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    """0 for --message-interval divided 0/0 on every reconcile (no status ever written), a
    negative deadline made every Progressing deployment Failed at once, nan never resynced."""
    err = refused(capsys, flag, value)
    assert flag in err and "positive, finite number of seconds" in err


@pytest.mark.parametrize("value", ["-1", "65536", "99999"])
def test_a_metrics_port_outside_the_tcp_range_is_refused(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    err = refused(capsys, "--metrics-port", value)
    assert "--metrics-port" in err and "0 to 65535" in err


def test_valid_periods_and_ports_are_accepted() -> None:
    args = parse_args(
        ["--resync-seconds", "2.5", "--message-interval", "1", "--metrics-port", "65535"]
    )
    assert (args.resync_seconds, args.message_interval, args.metrics_port) == (2.5, 1.0, 65535)


def test_the_conflict_quiet_period_defaults_to_a_minute_and_can_be_set() -> None:
    """``--conflict-quiet-seconds``: the writer's default (docs/reporter.md), or the value given.
    (That it reaches the StatusWriter: the e2e garbage-status test reads the period the
    reporter's conflict message names.)"""
    assert parse_args([]).conflict_quiet_seconds == CONFLICT_QUIET_SECONDS == 60.0
    assert parse_args(["--conflict-quiet-seconds", "5"]).conflict_quiet_seconds == 5.0
    assert parse_args(["--conflict-quiet-seconds", "1"]).conflict_quiet_seconds == 1.0


@pytest.mark.parametrize("value", ["0.001", "0.5"])
def test_a_conflict_quiet_period_under_a_second_is_refused(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """Review: a period like 0.001 s made every write of the other writer a new logged,
    counted conflict, at nearly that writer's own rate."""
    err = refused(capsys, "--conflict-quiet-seconds", value)
    assert "--conflict-quiet-seconds" in err and "under 1 s" in err


@pytest.mark.parametrize("value", ["", "Bad_Name", "a,b", "a b", "-a", "a" * 254])
def test_a_deployment_name_that_no_cr_can_have_is_refused(capsys, value: str) -> None:
    """Found re-reading issue 16 item 4: ``--deployment 'a,b'`` went into the label selector
    (``instance in (a,b)``, two deployments' objects) and a name no CR can have into field
    selectors the API server refuses, every few seconds, for ever."""
    err = refused(capsys, f"--deployment={value}")
    assert "--deployment" in err and "DNS subdomain" in err


@pytest.mark.parametrize("value", ["a" * 64, "x." * 40 + "y", "a" * 253])
def test_a_deployment_name_whose_instance_label_is_too_long_is_refused(capsys, value) -> None:
    """Review of issue 16: a 64-253 character DNS subdomain was accepted, but its instance
    label value (dots to hyphens) exceeds 63 characters, so the API server refused every
    list with 400, for ever."""
    err = refused(capsys, "--deployment", value)
    assert "--deployment" in err and "63" in err


@pytest.mark.parametrize("value", ["Not_A_Name!", "-a", "a..b", "a" * 254])
def test_a_lease_name_that_is_not_a_dns_subdomain_is_refused(capsys, value: str) -> None:
    """A Lease no API server accepts was found only at the first renewal, every 2 s."""
    err = refused(capsys, f"--lease-name={value}", "--identity", "x")
    assert "--lease-name" in err and "DNS subdomain" in err


def test_shared_watches_without_a_deployment_is_refused(capsys) -> None:
    """``--shared-watches`` alone was silently ignored (every CR watched cluster-wide)."""
    err = refused(capsys, "--shared-watches")
    assert "--shared-watches" in err and "--deployment" in err


@pytest.mark.parametrize("value", ["Pmem", "a.b", "x" * 64])
def test_a_namespace_that_is_not_a_dns_label_is_refused(capsys, value: str) -> None:
    err = refused(capsys, "--namespace", value)
    assert "--namespace" in err and "DNS label" in err


def test_valid_names_are_accepted() -> None:
    args = parse_args(
        [
            "--deployment",
            "pmem-csi.intel.com",
            "--deployment",
            "b",
            "--shared-watches",
            "--namespace",
            "pmem-csi",
        ]
    )
    assert args.deployment == ["pmem-csi.intel.com", "b"] and args.namespace == "pmem-csi"

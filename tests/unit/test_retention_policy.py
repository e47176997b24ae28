"""The retention policy (kernel.retention): which days apply to a finished session, and
the settings that configure it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from kernel.retention import RetentionPolicy, finished_status

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_sessions_own_days_win_then_its_status_then_the_default() -> None:
    policy = RetentionPolicy(days=30, by_status={"failed": 90, "succeeded": None})
    assert policy.days_for({"retention_days": 2}, "failed") == 2
    assert policy.days_for({}, "failed") == 90
    assert policy.days_for({}, "succeeded") is None  # kept forever, whatever the default
    assert policy.days_for({}, "cancelled") == 30
    assert policy.days_for({"retention_days": "soon"}, "cancelled") is None  # not a number
    assert RetentionPolicy().days_for({}, "failed") is None  # off by default


def test_due_once_the_last_commit_is_older_than_the_days() -> None:
    policy = RetentionPolicy(days=30)
    assert policy.due({}, "succeeded", NOW - timedelta(days=30, seconds=1), NOW)
    assert not policy.due({}, "succeeded", NOW - timedelta(days=29), NOW)
    assert not RetentionPolicy().due({}, "succeeded", NOW - timedelta(days=9999), NOW)


def test_a_finished_sessions_status_is_its_worst_root_outcome() -> None:
    assert finished_status(["succeeded", "failed", "cancelled"]) == "failed"
    assert finished_status(["cancelled", "faulted"]) == "faulted"
    assert finished_status([None, "succeeded"]) == "succeeded"
    assert finished_status([]) == "succeeded"


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown status \\['done'\\]"):
        RetentionPolicy(days=1, by_status={"done": 3})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KERNEL_RETENTION_DAYS", "a week", "KERNEL_RETENTION_DAYS: 'a week' is not a number"),
        ("KERNEL_RETENTION_DAYS_BY_STATUS", "failed=-1",
         "KERNEL_RETENTION_DAYS_BY_STATUS\\[failed\\]: '-1' is not a number"),
    ],
)
def test_settings_refuse_days_that_are_not_days(name: str, value: str, message: str) -> None:
    env = {**os.environ, name: value, "DJANGO_DEBUG": "1"}
    found = subprocess.run(
        [sys.executable, "-c", "import controlplane.settings"], env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert found.returncode != 0
    assert "ImproperlyConfigured" in found.stderr
    assert re.search(message, found.stderr), found.stderr[-500:]


@pytest.mark.parametrize("days", [1e6, 1e300, 10**400, float("inf"), float("nan"), 2e9])
def test_a_stored_retention_beyond_any_date_keeps_the_session_and_raises_nothing(
    days: float,
) -> None:
    policy = RetentionPolicy(days=1)
    long_ago = datetime.min.replace(tzinfo=UTC)
    assert not policy.due({"retention_days": days}, "succeeded", long_ago, NOW)
    assert not RetentionPolicy(days=days).due({}, "succeeded", long_ago, NOW)


def test_a_sessions_own_retention_is_checked_where_it_is_written() -> None:
    from kernel.retention import MAX_RETENTION_DAYS, check_retention_days

    assert check_retention_days(0) == 0 and check_retention_days(MAX_RETENTION_DAYS) == 36_525
    for bad in (-1, MAX_RETENTION_DAYS + 1, 1e6, True, "7", None, float("inf")):
        with pytest.raises(ValueError, match="retention_days: a number of days from 0"):
            check_retention_days(bad)

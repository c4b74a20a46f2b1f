"""Job ids: 32 hex digits, unique, and in the order they were made from one millisecond to the
next (so a store's index of ids grows at its end)."""

from __future__ import annotations

import re

from tidegate.queue.base import new_job_id


def test_ids_are_32_hex_digits_and_unique() -> None:
    ids = [new_job_id(1_733_450_000_000) for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", job_id) for job_id in ids)
    assert len(set(ids)) == len(ids)


def test_ids_of_later_milliseconds_sort_after() -> None:
    times = [1_733_450_000_000 + step for step in range(0, 5_000, 7)]
    ids = [new_job_id(ms) for ms in times]
    assert ids == sorted(ids)

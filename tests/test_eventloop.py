"""How tidegate's processes run: on uvloop, with the collector set for a server while the loop
runs and given back as it was afterwards."""

from __future__ import annotations

import asyncio
import gc
import weakref

from tidegate._eventloop import GC_THRESHOLDS, run, server_gc


def test_run_uses_uvloop_and_returns_the_result() -> None:
    async def main() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(main()).startswith("uvloop")


def test_the_server_collector_is_set_while_the_loop_runs_and_given_back_after() -> None:
    before = gc.get_threshold()
    survivor = {"made": "before the loop"}

    async def main() -> tuple[tuple[int, int, int], int]:
        return gc.get_threshold(), gc.get_freeze_count()

    thresholds, frozen = run(main())

    assert thresholds == GC_THRESHOLDS
    assert frozen > 0  # the objects alive at the start, `survivor` among them
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert survivor["made"] == "before the loop"


def test_cycles_made_while_serving_are_still_collected() -> None:
    with server_gc():
        class Node:
            other: object = None

        first, second = Node(), Node()
        first.other, second.other = second, first
        watched = weakref.ref(first)
        del first, second

        gc.collect()

        assert watched() is None

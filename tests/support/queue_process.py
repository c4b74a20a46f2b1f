"""A queue client run as its own OS process by the multi-process tests.

    python -m tests.support.queue_process URL NAME drain OUT_FILE
        print "ready", then claim and complete until no job arrives for a second (the first
        claim waits up to 30 s); write each claimed id to OUT_FILE
    python -m tests.support.queue_process URL NAME hold
        claim one job with a one-second lease, print its id and token, then hang until killed
    python -m tests.support.queue_process URL NAME enqueue PRIORITY
        enqueue one job and print its id
    python -m tests.support.queue_process URL NAME enqueue-on-go PRIORITY
        open the queue, print "ready", wait for a line on stdin, then enqueue one job and print
        its id (the enqueue comes at a moment the test chooses, not after an interpreter start)
"""

from __future__ import annotations

import asyncio
import os
import sys

from tidegate import Queue


async def main(url: str, name: str, mode: str, *rest: str) -> list[str]:
    """Run one mode; returns the ids claimed (drain mode)."""
    claimed: list[str] = []
    async with Queue.from_url(url, name=name, maintenance_interval_s=None) as queue:
        worker = f"proc-{os.getpid()}"
        if mode == "drain":
            print("ready", flush=True)
            idle_s = 30.0
            while jobs := await queue.claim(worker, limit=25, timeout_s=idle_s):
                lost = await queue.complete_many((job, {"by": worker}) for job in jobs)
                assert not lost, lost
                claimed += [job.id for job in jobs]
                idle_s = 1.0
        elif mode == "hold":
            jobs = await queue.claim(worker, lease_s=1.0, timeout_s=10)
            print(jobs[0].id, jobs[0].lease_token, flush=True)
            await asyncio.sleep(3600)
        elif mode == "enqueue":
            print(await queue.enqueue({"from": worker}, priority=rest[0]), flush=True)
        elif mode == "enqueue-on-go":
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            print(await queue.enqueue({"from": worker}, priority=rest[0]), flush=True)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    return claimed


if __name__ == "__main__":
    ids = asyncio.run(main(*sys.argv[1:]))
    if sys.argv[3] == "drain":
        with open(sys.argv[4], "w") as out:
            out.writelines(f"{job_id}\n" for job_id in ids)

"""A rate-limiter client run as its own OS process by the multi-process limiter test.

    python -m tests.support.limiter_process URL NAME KEY RPM PERIOD_S START_AT DURATION_S OUT_FILE

Waits until the wall-clock time START_AT (epoch seconds, so several processes start together),
then for DURATION_S acquires on KEY with four concurrent callers, sleeping the returned waits, and
writes the wall-clock time of every admission to OUT_FILE, one per line.
"""

from __future__ import annotations

import asyncio
import sys
import time

from tidegate.coord.limiter import RedisRateLimiter

CALLERS = 4


async def main(url: str, name: str, key: str, rpm: int, period_s: float, start_at: float,
               duration_s: float) -> list[float]:
    """Acquire as fast as the limiter allows; return the admission times."""
    admitted: list[float] = []
    async with RedisRateLimiter(url, name) as limiter:
        await limiter.state(key)  # connect before the start, so the first call is not slower
        await asyncio.sleep(max(start_at - time.time(), 0))
        end = start_at + duration_s

        async def caller() -> None:
            while True:
                wait_s = await limiter.acquire(key, tokens=1, rpm=rpm, tpm=None, period_s=period_s)
                now = time.time()
                if wait_s == 0:
                    admitted.append(now)
                if now >= end:
                    return
                if wait_s > 0:
                    await asyncio.sleep(min(wait_s, end - now))

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return admitted


if __name__ == "__main__":
    url, name, key, rpm, period, start, duration, out = sys.argv[1:]
    times = asyncio.run(main(url, name, key, int(rpm), float(period), float(start), float(duration)))
    with open(out, "w") as handle:
        handle.writelines(f"{t!r}\n" for t in times)

"""How both stores keep a user's profile: half precision with a power-of-two scale.

A profile is computed in double precision and, once the user's events of a batch are applied,
kept as IEEE half-precision components (`struct`'s "e": rounded to nearest, ties to even, as
numpy's float16 and lua/record.lua round) of the profile divided by `2^exponent`, the exponent the
smallest that keeps every component below 2^15. The scale only matters for a profile with a
component of 32,768 or more (tens of thousands of interactions within a half-life): a power of
two, it changes no digit, and the half's 11 significant bits stay relative to each component.

Why half precision: it is a quarter of a user's state in Redis at 64 dimensions (128 B against
256 B in float32), and the profile only ever serves cosine similarities, which 11 bits give to
about 1e-3 (checked on recommendation quality, see BENCHMARKS.md). A component's relative error
is at most 2^-11 per batch; the decay between two events less than about a thirtieth of a
half-life apart can round away, which a profile's half-life of hours makes negligible.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

__all__ = ["HALF_LIMIT_EXPONENT", "pack_profile", "profile_exponent", "unpack_profile"]

HALF_LIMIT_EXPONENT = 15  # components are scaled below 2^15, well inside float16's 65,504


def profile_exponent(profile: Sequence[float]) -> int:
    """The power of two the profile is divided by before it is rounded to halves (0 but for a
    profile with a component of 2^15 or more)."""
    largest = max(map(abs, profile), default=0.0)
    if not math.isfinite(largest):
        return 0
    return max(0, math.frexp(largest)[1] - HALF_LIMIT_EXPONENT)


def pack_profile(profile: Sequence[float]) -> tuple[int, bytes]:
    """The profile's exponent and its components as little-endian halves of `profile / 2^exponent`."""
    exponent = profile_exponent(profile)
    scaled = profile if exponent == 0 else [math.ldexp(x, -exponent) for x in profile]
    return exponent, struct.pack(f"<{len(profile)}e", *scaled)


def unpack_profile(blob: bytes, offset: int, count: int, exponent: int) -> list[float]:
    """The `count` components packed at `offset` with `exponent` (see `pack_profile`)."""
    halves = struct.unpack_from(f"<{count}e", blob, offset)
    return list(halves) if exponent == 0 else [math.ldexp(x, exponent) for x in halves]

"""How both stores keep a user's profile: 16-bit fixed point with a power-of-two scale.

A profile is computed in double precision and, once the user's events of a batch are applied,
kept as signed 16-bit integers `floor(component · 2^(14 - exponent) + 0.5)`, `exponent` the
smallest with every component below `2^exponent` in magnitude, so the largest component takes 14
of the 15 bits. The scaling by a power of two is exact and the addition and floor are the same
double operations in Python and in lua/record.lua, so both stores hold the same integers to the
bit.

Why: it is a quarter of a user's state in Redis at 64 dimensions (128 B against 256 B in float32),
and the profile only ever serves cosine similarities: each component is kept to within 2^-15 of
the largest (an error in the similarity of about 1e-4; recommendation quality is unchanged, see
BENCHMARKS.md). A component far below the largest keeps fewer digits, which a cosine does not
miss. Fixed point rather than half floats because Redis's Lua rounds it with one multiplication,
an addition and a floor per component: it runs on every write of a user.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

__all__ = ["FRACTION_BITS", "pack_profile", "profile_exponent", "unpack_profile"]

FRACTION_BITS = 14  # the largest component is below 2^14 once scaled


def profile_exponent(profile: Sequence[float]) -> int:
    """The power of two every component of the profile is below (0 for a zero profile)."""
    largest = max(map(abs, profile), default=0.0)
    if largest == 0.0:
        return 0
    if not math.isfinite(largest):
        raise ValueError("a profile component is not finite")
    return math.frexp(largest)[1]


def pack_profile(profile: Sequence[float]) -> tuple[int, bytes]:
    """The profile's exponent and its components as little-endian int16 (see the module doc)."""
    exponent = profile_exponent(profile)
    scale = math.ldexp(1.0, FRACTION_BITS - exponent)
    floor = math.floor
    return exponent, struct.pack(f"<{len(profile)}h", *[floor(x * scale + 0.5) for x in profile])


def unpack_profile(blob: bytes, offset: int, count: int, exponent: int) -> list[float]:
    """The `count` components packed at `offset` with `exponent` (see `pack_profile`)."""
    shift = exponent - FRACTION_BITS
    return [math.ldexp(q, shift) for q in struct.unpack_from(f"<{count}h", blob, offset)]

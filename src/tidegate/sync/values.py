"""Row values in one stable form: canonical JSON, SHA-256 checksums and UTC timestamps.

A row's checksum must not depend on how it reached us: the same row read by the snapshot, decoded
from the replication stream, or written by a SQLite trigger hashes the same when its values are
the same. So every value is first brought to one JSON-compatible form:

- Decimal → its plain decimal string (no exponent; the scale is kept: "1.10" stays "1.10");
- datetime → UTC ISO 8601 with microseconds and a "Z" (naive ones are read in the source zone);
- date → "YYYY-MM-DD"; time → ISO; UUID → its canonical string; bytes → lower-case hex;
- tuples/lists, dicts → the same, recursively; floats must be finite.

Canonical JSON is that form serialised with sorted keys and no whitespace.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime, time, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import orjson

from tidegate.errors import InvalidChange

__all__ = [
    "JsonValue",
    "Row",
    "canonical",
    "canonical_json",
    "checksum",
    "normalise_timestamp",
    "source_zone",
]

JsonValue = Any  # None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]
Row = dict[str, JsonValue]

# Epoch numbers at or above this are milliseconds: 1e11 seconds would be the year 5138, while
# 1e11 milliseconds is 1973, so the two ranges used in practice never overlap.
_EPOCH_MS_FROM = 100_000_000_000


def source_zone(name: str | None) -> tzinfo:
    """The zone naive timestamps of a source are read in ("UTC" when not configured)."""
    if not name or name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError) as exc:
        raise InvalidChange(f"unknown time zone {name!r} for the source's naive timestamps") from exc


def _utc_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def normalise_timestamp(value: object, zone: tzinfo = UTC) -> str:
    """Any timestamp form found in rows, as a UTC ISO 8601 string.

    Accepts an aware datetime, a naive datetime (read in `zone`), an ISO 8601 string (naive ones
    read in `zone`; a trailing "Z" is UTC), and epoch seconds or milliseconds (int, float or
    numeric string). Anything else raises InvalidChange naming the value.
    """
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=zone)
        return _utc_iso(moment)
    if isinstance(value, bool):
        raise InvalidChange(f"{value!r} is not a timestamp")
    if isinstance(value, int | float | Decimal):
        return _from_epoch(float(value), value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return _from_epoch(float(text), value)
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
        except ValueError as exc:
            raise InvalidChange(f"{value!r} is not an ISO 8601 timestamp or epoch number") from exc
        return normalise_timestamp(parsed, zone)
    raise InvalidChange(f"{value!r} ({type(value).__name__}) is not a timestamp")


def _from_epoch(number: float, original: object) -> str:
    if not math.isfinite(number):
        raise InvalidChange(f"{original!r} is not a timestamp")
    seconds = number / 1000 if abs(number) >= _EPOCH_MS_FROM else number
    try:
        return _utc_iso(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError) as exc:
        raise InvalidChange(f"{original!r} is out of range as an epoch timestamp") from exc


_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})


def canonical(value: object, zone: tzinfo = UTC) -> JsonValue:
    """`value` in the one JSON-compatible form checksums are computed over (see module doc)."""
    # Exact-type checks first: rows are mostly str/int/None, and this runs for every value of
    # every change, so the common cases must not walk the isinstance chain below.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): canonical(v, zone) for k, v in value.items()}  # type: ignore[attr-defined]
    if kind is list or kind is tuple:
        return [canonical(v, zone) for v in value]  # type: ignore[attr-defined]
    return _canonical_other(value, zone)


def _canonical_other(value: object, zone: tzinfo) -> JsonValue:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidChange(f"{value!r} has no canonical JSON form")
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidChange(f"{value!r} has no canonical JSON form")
        return format(value, "f")
    if isinstance(value, datetime):
        return normalise_timestamp(value, zone)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, time):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(k): canonical(v, zone) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v, zone) for v in value]
    raise InvalidChange(f"a {type(value).__name__} value has no canonical JSON form: {value!r}")


def canonical_json(value: object) -> bytes:
    """Canonical JSON bytes of an already canonical value: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def checksum(row: Mapping[str, JsonValue] | None) -> str:
    """SHA-256 (hex) of a canonical row's canonical JSON; the checksum of no row is of `null`."""
    return hashlib.sha256(canonical_json(row)).hexdigest()

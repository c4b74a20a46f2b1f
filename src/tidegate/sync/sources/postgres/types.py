"""PostgreSQL column values in text form → Python values, by type OID.

Both ways a row reaches tidegate — pgoutput's TupleData and the snapshot's SELECT — deliver each
value as the text of the type's output function, so one decoder per type serves both and a row
decodes the same whichever way it came. psycopg2's own typecasters do the parsing where they
work without a live cursor (integers, numeric, floats, booleans, dates, times, naive timestamps,
bytea) and its array caster parses array syntax (quoting, NULL elements, nesting) around our
element decoders. Written here is only what psycopg2 cannot do without a cursor: timestamptz
(its caster needs the cursor's tzinfo factory), json/jsonb with orjson, and uuid.

The text both connections produce must be the same, so the source pins the session settings
that shape it (`SESSION_OPTIONS`). Values Python cannot hold keep their text: 'infinity' dates
and timestamps, years outside 1-9999 (BC included), '24:00:00', NaN and infinite numbers —
their canonical form is then that text, the same from the snapshot and the stream. Unknown type
OIDs (enums, domains of unknown types, geometric types, intervals…) are the text as is.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Callable
from datetime import datetime, tzinfo
from decimal import Decimal
from functools import cache
from typing import Any

import orjson

from tidegate.sync.sources.postgres.driver import psycopg2
from tidegate.sync.values import canonical

__all__ = ["ARRAY_ELEMENTS", "SESSION_OPTIONS", "canonical_decoder_for", "decode_text", "decoder_for"]

logger = logging.getLogger(__name__)

# Session settings that decide the text form of values; every connection of the source sets them
# (libpq `options`), so the snapshot and the replication stream write values alike.
SESSION_OPTIONS = {
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
}

Decoder = Callable[[str], object]

# Built-in type OIDs (pg_type.dat).
BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 114, 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1114, 1184, 1700, 2950, 3802

# Array type OID → element type OID, for the element types decoded here.
ARRAY_ELEMENTS = {
    1000: BOOL, 1001: BYTEA, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT,
    1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR, 1015: VARCHAR, 1182: DATE,
    1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1231: NUMERIC, 2951: UUID, 3807: JSONB,
}

_INFINITIES = frozenset({"infinity", "-infinity"})


def _psycopg(type_oid: int) -> Any:
    return psycopg2.extensions.string_types[type_oid]


def _cast_with(type_oid: int) -> Decoder:
    caster = _psycopg(type_oid)

    def decode(text: str) -> object:
        return caster(text, None)

    return decode


def _text(text: str) -> object:
    return text


def _number(caster: Decoder) -> Decoder:
    # NaN and ±Infinity have no canonical JSON number: they stay text.
    def decode(text: str) -> object:
        value = caster(text)
        if isinstance(value, Decimal) and not value.is_finite():
            return text
        if isinstance(value, float) and not math.isfinite(value):
            return text
        return value

    return decode


def _moment(caster: Decoder) -> Decoder:
    # 'infinity' would become datetime.max (indistinguishable from a real 9999-12-31 value) and
    # years outside 1-9999 cannot be held at all: both keep their text.
    def decode(text: str) -> object:
        if text in _INFINITIES or text.endswith(" BC"):
            return text
        try:
            return caster(text)
        except (ValueError, psycopg2.DataError):
            return text

    return decode


def _timestamptz(text: str) -> object:
    # ISO DateStyle: "2024-05-06 07:08:09.123456+00", offsets may carry minutes and seconds.
    return datetime.fromisoformat(text)


def _time(caster: Decoder) -> Decoder:
    def decode(text: str) -> object:
        # 24:00:00 is a valid PostgreSQL time that datetime.time cannot hold.
        return text if text.startswith("24:") else caster(text)

    return decode


def _bytea(text: str) -> object:
    return bytes(_psycopg(BYTEA)(text, None))


def _json(text: str) -> object:
    # JSON numbers become int or float as orjson parses them (integers beyond 64 bits as float):
    # lossy for extreme values, but the same from the snapshot and the stream.
    return orjson.loads(text)


def _uuid(text: str) -> object:
    return uuid.UUID(text)


def _scalar_decoders() -> dict[int, Decoder]:
    integer, numeric, floating = _cast_with(INT4), _cast_with(NUMERIC), _cast_with(FLOAT8)
    return {
        BOOL: _cast_with(BOOL),
        BYTEA: _bytea,
        INT2: integer, INT4: integer, INT8: _cast_with(INT8), OID: integer,
        NUMERIC: _number(numeric), FLOAT4: _number(floating), FLOAT8: _number(floating),
        TEXT: _text, VARCHAR: _text, BPCHAR: _text, NAME: _text,
        DATE: _moment(_cast_with(DATE)),
        TIME: _time(_cast_with(TIME)),
        TIMESTAMP: _moment(_cast_with(TIMESTAMP)),
        TIMESTAMPTZ: _moment(_timestamptz),
        JSON: _json, JSONB: _json,
        UUID: _uuid,
    }


_SCALARS = _scalar_decoders()


def _array(array_oid: int, element: Decoder) -> Decoder:
    element_caster = psycopg2.extensions.new_type(
        (ARRAY_ELEMENTS[array_oid],), f"TIDEGATE_{array_oid}_ELEMENT",
        lambda text, _cursor: None if text is None else element(text),
    )
    array_caster = psycopg2.extensions.new_array_type(
        (array_oid,), f"TIDEGATE_{array_oid}", element_caster
    )

    def decode(text: str) -> object:
        return array_caster(text, None)

    return decode


def _in_zone(decoder: Decoder, zone: tzinfo) -> Decoder:
    def decode(text: str) -> object:
        value = decoder(text)
        return value.replace(tzinfo=zone) if isinstance(value, datetime) else value

    return decode


def _tolerant(decoder: Decoder, type_oid: int) -> Decoder:
    # A value the decoder cannot parse (PostgreSQL's output functions should never write one)
    # keeps its text, with one warning per type, rather than stopping the flow.
    def decode(text: str) -> object:
        try:
            return decoder(text)
        except (ValueError, TypeError, psycopg2.Error) as exc:
            if type_oid not in _warned:
                _warned.add(type_oid)
                logger.warning("cannot parse a value of type oid %d (%s); keeping its text",
                               type_oid, exc)
            return text

    return decode


_warned: set[int] = set()


@cache
def decoder_for(type_oid: int, zone: tzinfo | None = None) -> Decoder:
    """The decoder of one type's text form (the text itself for types not known here). With a
    `zone`, `timestamp` values (naive in PostgreSQL) come back aware, read in that zone."""
    element_oid = ARRAY_ELEMENTS.get(type_oid)
    base_oid = type_oid if element_oid is None else element_oid
    scalar = _SCALARS.get(base_oid)
    if scalar is None:
        return _text
    if zone is not None and base_oid == TIMESTAMP:
        scalar = _in_zone(scalar, zone)
    return _tolerant(scalar if element_oid is None else _array(type_oid, scalar), type_oid)


def decode_text(type_oid: int, text: str | None, zone: tzinfo | None = None) -> object:
    """The Python value of `text` of type `type_oid` (None for SQL NULL); see `decoder_for`."""
    return None if text is None else decoder_for(type_oid, zone)(text)


# ---------------------------------------------------------------------- canonical decoders
#
# The replication stream wants each value in its canonical form (`tidegate.sync.values`) at
# once: decoding to a Python value and canonicalising it after costs two passes and, for the
# common types, objects that are thrown away (a Decimal to print it again, a datetime to write
# it back as ISO text). Each fast path below returns exactly `canonical(decoder_for(oid)(text))`
# for the text PostgreSQL writes under SESSION_OPTIONS, and falls back to that composition for
# any text it does not recognise, so the two can never disagree.


def _composed(decoder: Decoder) -> Decoder:
    def decode(text: str) -> object:
        return canonical(decoder(text))

    return decode


def _canonical_integer(general: Decoder) -> Decoder:
    def decode(text: str) -> object:
        try:
            return int(text)
        except ValueError:
            return general(text)

    return decode


# numeric_out's plain decimal: what format(Decimal(text), "f") writes back unchanged.
_PLAIN_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?").fullmatch
# timestamptz_out under TimeZone=UTC and DateStyle ISO, a four-digit year AD.
_UTC_TIMESTAMP = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2})(\.[0-9]{1,6})?\+00").fullmatch


def _canonical_numeric(general: Decoder) -> Decoder:
    # NaN and ±Infinity stay text on both paths.
    def decode(text: str) -> object:
        return text if _PLAIN_DECIMAL(text) else general(text)

    return decode


def _canonical_bool(general: Decoder) -> Decoder:
    def decode(text: str) -> object:
        if text == "t":
            return True
        if text == "f":
            return False
        return general(text)

    return decode


def _canonical_timestamptz(general: Decoder) -> Decoder:
    # Canonical: "YYYY-MM-DDTHH:MM:SS.ffffffZ". Years beyond 9999, BC, infinities and other
    # offsets take the long way.
    def decode(text: str) -> object:
        match = _UTC_TIMESTAMP(text)
        if match is None:
            return general(text)
        day, clock, fraction = match.groups()
        return f"{day}T{clock}{fraction or '.':0<7}Z"

    return decode


_CANONICAL_FAST: dict[int, Callable[[Decoder], Decoder]] = {
    INT2: _canonical_integer, INT4: _canonical_integer, INT8: _canonical_integer,
    OID: _canonical_integer, NUMERIC: _canonical_numeric, BOOL: _canonical_bool,
    TIMESTAMPTZ: _canonical_timestamptz,
}


@cache
def canonical_decoder_for(type_oid: int, zone: tzinfo | None = None) -> Decoder:
    """The decoder of one type's text form straight to its canonical value: the same as
    `canonical(decoder_for(type_oid, zone)(text))`, without the intermediate value for the
    common types. Text types (and types not known here) return `_text`, the identity, which a
    caller may recognise to skip the call."""
    if type_oid not in ARRAY_ELEMENTS and _SCALARS.get(type_oid, _text) is _text:
        return _text
    general = decoder_for(type_oid, zone)
    fast = _CANONICAL_FAST.get(type_oid)
    composed = _composed(general)
    return fast(composed) if fast is not None else composed


def is_identity(decoder: Decoder) -> bool:
    """True for the decoder that returns the text as it is (text types, unknown types)."""
    return decoder is _text

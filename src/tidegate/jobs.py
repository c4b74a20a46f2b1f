"""Plain job types: priorities, states, job records and job specs. No I/O, no package imports
beyond the error tree."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Any, NotRequired, TypedDict, cast

import orjson

from tidegate.errors import InvalidJob, InvalidPriority

JsonObject = dict[str, Any]


class Priority(IntEnum):
    """Priority levels; a lower number is served first."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3
    BULK = 4

    @classmethod
    def parse(cls, value: object) -> Priority:
        """Accept a Priority, an int 0-4, a digit string or a name in any case."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, bool):  # bool is an int subclass; True is not a priority
            raise InvalidPriority(f"invalid priority {value!r}: use a name or 0-4")
        if isinstance(value, int):
            if 0 <= value <= 4:
                return cls(value)
        elif isinstance(value, str):
            text = value.strip()
            # isdigit() alone also passes "²", which int() refuses.
            if text.isascii() and text.isdigit() and 0 <= int(text) <= 4:
                return cls(int(text))
            member = cls.__members__.get(text.upper())
            if member is not None:
                return member
        names = ", ".join(p.name.lower() for p in cls)
        raise InvalidPriority(f"invalid priority {value!r}: use one of {names} or 0-4")


class JobState(StrEnum):
    """Where a job is in its life. FINAL_STATES never change again (except by redrive of dead)."""

    QUEUED = "queued"
    DELAYED = "delayed"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # failed an attempt; waits as a delayed job for its retry
    DEAD = "dead"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED, JobState.EXPIRED})


def now_ms() -> int:
    """Wall-clock time in integer milliseconds since the epoch, the unit every backend stores."""
    return time.time_ns() // 1_000_000


def ms_to_datetime(ms: int | None) -> datetime | None:
    """Epoch milliseconds → aware UTC datetime (None stays None)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC)


def datetime_to_ms(value: datetime) -> int:
    """Aware datetime → epoch milliseconds. Naive datetimes are refused: their zone is a guess."""
    if value.tzinfo is None:
        raise InvalidJob(f"naive datetime {value.isoformat()} given: use a timezone-aware datetime")
    return int(value.timestamp() * 1000)


class JobFailure(TypedDict):
    """How a job failed for good, recorded by the worker with the dead job: what an
    OpenAI-compatible API answers a caller who waited for it.

    `status` is the HTTP status to answer: the provider's own for a request it refused (4xx),
    the router's or the budget's refusal (403, 404, 400, 429), 502 when retries ran out.
    `type`, `code` and `message` are the OpenAI error's fields; `param` names the refused
    parameter when known, `upstream_status` is what the provider answered, if it answered.
    """

    status: int
    type: str
    code: str
    message: str
    param: NotRequired[str]
    upstream_status: NotRequired[int]
    model: NotRequired[str]


@dataclass(slots=True)
class Job:
    """A job as stored: what was asked, where it is, and the lease a worker holds on it."""

    id: str
    priority: Priority
    payload: JsonObject
    tenant: str
    state: JobState
    created_at: datetime
    attempts: int
    max_attempts: int
    not_before: datetime | None = None
    deadline: datetime | None = None
    idempotency_key: str | None = None
    callback_url: str | None = None
    last_error: str | None = None
    result: Any = None
    finished_at: datetime | None = None
    lease_token: int | None = None
    worker_id: str | None = None
    lease_expires_at: datetime | None = None
    ready_at: datetime | None = None  # when it last became claimable: the start of its queue wait
    errors: list[str] = field(default_factory=list)  # every attempt's error, oldest first
    failure: JobFailure | None = None  # a dead job's structured failure, when its worker gave one
    # A caller waits for the answer (JobSpec.caller_waits), until it gives up (Queue.caller_gave_up).
    caller_waits: bool = False

    @property
    def is_final(self) -> bool:
        """True once the job can no longer change by itself."""
        return self.state in FINAL_STATES

    @classmethod
    def from_record(cls, record: Mapping[str, Any], payload: bytes | str | JsonObject,
                    result: bytes | str | None = None) -> Job:
        """Build a Job from the record shape both backends store (times in epoch ms); the
        payload as stored (JSON) or already parsed."""
        created = ms_to_datetime(int(record["created_ms"]))
        assert created is not None
        return cls(
            id=str(record["id"]),
            priority=Priority(int(record["priority"])),
            payload=payload if isinstance(payload, dict) else orjson.loads(payload),
            tenant=str(record["tenant"]),
            state=JobState(record["state"]),
            created_at=created,
            attempts=int(record["attempts"]),
            max_attempts=int(record["max_attempts"]),
            not_before=ms_to_datetime(_opt_int(record.get("not_before_ms"))),
            deadline=ms_to_datetime(_opt_int(record.get("deadline_ms"))),
            idempotency_key=_opt_str(record.get("idempotency_key")),
            callback_url=_opt_str(record.get("callback_url")),
            last_error=_opt_str(record.get("last_error")),
            result=None if result is None else orjson.loads(result),
            finished_at=ms_to_datetime(_opt_int(record.get("finished_ms"))),
            # A token only means something while the job is leased; unclaimed jobs carry none.
            lease_token=_opt_int(record.get("lease_token")) if record["state"] == "leased" else None,
            worker_id=_opt_str(record.get("worker_id")),
            lease_expires_at=ms_to_datetime(_opt_int(record.get("lease_expires_ms"))),
            ready_at=ms_to_datetime(_opt_int(record.get("ready_ms"))),
            errors=list(record.get("errors") or []),
            failure=_opt_failure(record.get("failure")),
            caller_waits=bool(record.get("caller_waits")),
        )


def _opt_int(value: Any) -> int | None:
    # Lua's cjson turns nil into a missing key and SQLite gives None; empty strings are never ids.
    if value is None or value == "" or value is False:
        return None
    return int(value)


def _opt_failure(value: Any) -> JobFailure | None:
    # Stored as JSON text (a SQLite column, a string in the Redis record); readers check the
    # fields they use, since a record may predate a field.
    if value is None or value == "" or value is False:
        return None
    decoded = orjson.loads(value)
    return cast(JobFailure, decoded) if isinstance(decoded, dict) else None


def _opt_str(value: Any) -> str | None:
    if value is None or value == "" or value is False:
        return None
    return str(value)


@dataclass(slots=True)
class JobSpec:
    """What a caller asks to enqueue. `Queue.enqueue_many` takes these or plain mappings with the
    same field names; any other field is refused."""

    payload: JsonObject
    priority: Priority | int | str = Priority.NORMAL
    tenant: str = "default"
    delay_s: float | None = None
    not_before: datetime | None = None
    deadline: datetime | None = None
    timeout_s: float | None = None  # deadline relative to now; an alternative to `deadline`
    max_attempts: int | None = None
    idempotency_key: str | None = None
    callback_url: str | None = None
    # A caller waits for the answer (a synchronous call): a spent budget ends the job at once
    # instead of deferring it, and once finished it is kept only the queue's `answered_ttl_s`
    # (unless `keep_answer`, or it has an idempotency key): its caller has the answer.
    caller_waits: bool = False
    keep_answer: bool = False  # kept `finished_ttl_s` even so: its answer may be fetched again

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> JobSpec:
        """Build a spec from a mapping, naming any field that is unknown or missing."""
        if not isinstance(data, Mapping):
            raise InvalidJob(f"a job must be a mapping of fields, got {type(data).__name__}")
        unknown = sorted(set(data) - _SPEC_FIELDS)
        if unknown:
            raise InvalidJob(
                f"unknown job field(s) {', '.join(map(repr, unknown))}; "
                f"known fields: {', '.join(sorted(_SPEC_FIELDS))}"
            )
        if "payload" not in data:
            raise InvalidJob("a job needs a 'payload' (a JSON object)")
        return cls(**data)


_SPEC_FIELDS = frozenset(f.name for f in fields(JobSpec))

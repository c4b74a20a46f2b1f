"""Typed settings of a queue, shared by every backend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

MIB = 1024 * 1024


class QueueSettings(BaseModel):
    """How a queue behaves. Every field has a safe default; anti-starvation is off by default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The queue's name; on Redis every key carries it, so queues of different names share a server.
    name: str = Field("default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # One job's request. 16 MiB holds a full 1M-token context (gpt-4.1, gemini-2.5-flash) at up
    # to 16 bytes a token: English text is ~4, and even text JSON-escaped as \uXXXX (~6 bytes a
    # character) stays below; the gateway's body limit follows it (gateway.max_body_bytes).
    max_payload_bytes: int = Field(16 * MIB, gt=0)
    # Most jobs one enqueue_many call may add (a bigger batch is refused, not split).
    max_batch: int = Field(10_000, gt=0)
    # Attempts a job gets when its enqueue does not say (the first one included).
    default_max_attempts: int = Field(3, ge=1)
    # How long a claim holds a job without a heartbeat before it is recovered for another worker.
    default_lease_s: float = Field(30.0, gt=0)
    # Retry backoff (full jitter): a retry waits a random time up to retry_base_s * 2**(attempt - 1).
    retry_base_s: float = Field(1.0, ge=0)
    # Retry backoff: the ceiling of that random time.
    retry_max_s: float = Field(300.0, ge=0)
    # Admission control: level → most jobs that may wait (queued) at that level.
    max_depth: dict[int, int] = Field(default_factory=dict)
    # The Retry-After a caller is told when a level is at its max_depth.
    queue_full_retry_after_s: float = Field(1.0, gt=0)
    # Anti-starvation: promote a waiting job one level per interval (never above CRITICAL).
    aging_interval_s: float | None = Field(None, gt=0)
    # Anti-starvation: serve tenants in turn inside a level instead of strictly FIFO.
    tenant_round_robin: bool = False
    # Retention: succeeded, cancelled and expired jobs (with results and idempotency keys).
    finished_ttl_s: float = Field(24 * 3600.0, gt=0)
    # Retention of such a job whose caller waited for it and was answered (a synchronous call,
    # without an Idempotency-Key or a stored response to fetch again): its answer was delivered,
    # so it is kept only long enough to be looked at. Never longer than finished_ttl_s. What is
    # needed for accounting (spend, usage) is in the budget ledger and metrics, not in the job.
    answered_ttl_s: float = Field(300.0, gt=0)
    # Retention: dead jobs (the dead-letter queue), kept to be inspected and redriven.
    dead_ttl_s: float = Field(7 * 24 * 3600.0, gt=0)
    # Background upkeep (lease recovery, deadline expiry, aging, retention); None turns it off
    # for callers that run `Queue.maintain()` themselves.
    maintenance_interval_s: float | None = Field(1.0, gt=0)
    # Durability across a Redis failover (Redis only): every state change returns only once this
    # many replicas hold it, waiting up to wait_timeout_s (then the call fails as unavailable,
    # its change possibly made on the master alone). 0: replication stays asynchronous.
    wait_replicas: int = Field(0, ge=0)
    wait_timeout_s: float = Field(1.0, gt=0)

    @property
    def answered_keep_s(self) -> float:
        """How long an answered job is kept: `answered_ttl_s`, at most `finished_ttl_s`."""
        return min(self.answered_ttl_s, self.finished_ttl_s)

    @field_validator("max_depth")
    @classmethod
    def _levels_known(cls, value: dict[int, int]) -> dict[int, int]:
        for level, depth in value.items():
            if not 0 <= level <= 4:
                raise ValueError(f"max_depth level {level} is not a priority level 0-4")
            if depth < 0:
                raise ValueError(f"max_depth for level {level} must be >= 0, got {depth}")
        return value

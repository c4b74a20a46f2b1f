"""The one exception tree of tidegate.

Catch a parent to handle a whole group (`except Unavailable:` retries whichever store was lost);
the leaves say which part raised.

    TidegateError
    ├── ConfigError                 settings or URLs that cannot work
    │   └── StoreFormatError        a store newer than the code, or with migrations left to run
    ├── MissingDependency           an optional extra is not installed
    ├── InvalidInput                input tidegate refuses; nothing of it was written
    │   ├── InvalidJob              a job description the queue refuses
    │   │   ├── InvalidPriority     not a priority name or level 0-4
    │   │   └── PayloadTooLarge     payload above the configured size
    │   ├── CallbackRefused         a callback URL that is not http(s) or not a public address
    │   ├── InvalidChange           a row or change event that cannot be turned into a Change
    │   └── InvalidRecsInput        an item, interaction or query the recommender refuses
    ├── NotFound                    no such thing (or not visible to the caller)
    │   ├── JobNotFound             no job with that id
    │   └── TenantNotFound          no tenant with that name (a key was asked for an unknown tenant)
    ├── Conflict                    the caller's view is stale; the call changed nothing
    │   ├── LeaseLost               a stale lease token: the job was recovered, re-claimed or cancelled
    │   └── VersionConflict         an optimistic update whose expected revision is not current
    ├── Unavailable                 a backend cannot be reached (driver errors are translated)
    │   ├── QueueUnavailable        the queue's Redis or SQLite
    │   ├── DispatchUnavailable     the rate limiter's or budget ledger's store
    │   ├── BusUnavailable          the event bus (Redis Streams, Kafka)
    │   └── CacheUnavailable        the entity cache's (or the recommender's) store
    ├── Closed                      used before it was opened or after it was closed
    │   ├── QueueClosed             the queue (and the tenant store that shares its backend)
    │   ├── ClientClosed            an upstream client
    │   └── DispatchClosed          a rate limiter or budget ledger
    ├── QueueFull                   admission control: a priority level is at its max depth
    ├── BudgetExhausted             a daily budget (tenant or global) has no room for a reservation
    ├── RoutingError                no configured model may serve a request (unknown, not allowed, too big)
    ├── UpstreamError               a provider call failed: kind, status, retryable, retry-after
    └── SourceError                 the change source (replication, outbox) failed or is misconfigured
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tidegate.providers.ratelimit import RateLimitInfo


class TidegateError(Exception):
    """Root of every error tidegate raises on purpose."""


class ConfigError(TidegateError):
    """A setting or URL that cannot work."""


class StoreFormatError(ConfigError):
    """A store this code must not open as it is: newer than the code (an upgrade of tidegate is
    needed), or with migrations pending while `[storage] migrate = "check"` (run `tidegate
    migrate --apply`). Nothing in the store was changed. `store` names it ("queue", "tenants", …,
    "file" for a SQLite file's layout), `where` says where (its URL without the password),
    `found` is its format and `readable` the newest this code reads."""

    def __init__(self, message: str, *, store: str, where: str, found: int, readable: int) -> None:
        super().__init__(message)
        self.store = store
        self.where = where
        self.found = found
        self.readable = readable


class PayloadFormatError(TidegateError):
    """A job's payload or result says it is in a format newer than this code reads: written by a
    newer release during a rolling upgrade. Not an invalid job: a newer worker can serve it, so a
    worker leaves such a job in the queue instead of failing it. `found` is the format it says,
    `readable` the newest this code reads."""

    def __init__(self, message: str, *, found: int, readable: int) -> None:
        super().__init__(message)
        self.found = found
        self.readable = readable


class MissingDependency(TidegateError):
    """An optional dependency is missing; the message names the extra to install."""


# -- the groups --------------------------------------------------------------------------------


class InvalidInput(TidegateError):
    """Input tidegate refuses (a job, a change, a recommender's item or query, a callback URL);
    nothing of it was written and sending it again cannot help. The message names the field."""


class NotFound(TidegateError):
    """No such thing, or not visible to the caller."""


class Conflict(TidegateError):
    """The caller acted on a state that is no longer current (a lease, a revision); the call
    changed nothing."""


class Unavailable(TidegateError):
    """A backend (queue, dispatch store, bus, cache) cannot be reached or answered with an error;
    the message names it by its URL, never its password. Trying again later may succeed."""


class Closed(TidegateError):
    """An object was used before it was opened or after it was closed; a closed one cannot be
    reopened: make a new one."""


# -- the queue ---------------------------------------------------------------------------------


class InvalidJob(InvalidInput):
    """A job description the queue refuses. Nothing of the request was written."""


class InvalidPriority(InvalidJob, ValueError):
    """A priority that is neither a known name nor a level 0-4."""


class PayloadTooLarge(InvalidJob):
    """A payload above the queue's configured maximum size."""


class QueueFull(TidegateError):
    """Admission control refused new work because a priority level is at its max depth."""

    def __init__(self, message: str, *, priority: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.priority = priority
        self.retry_after_s = retry_after_s


class LeaseLost(Conflict):
    """The caller's lease token is no longer current; the call changed nothing."""


class JobNotFound(NotFound):
    """No job with that id."""


class TenantNotFound(NotFound):
    """No tenant with that name: a key cannot be created for it."""


class QueueClosed(Closed):
    """The queue is closed, or was used before it was opened."""


class QueueUnavailable(Unavailable):
    """The queue's backend cannot be reached or answered with an error."""


class CallbackRefused(InvalidInput):
    """A callback URL tidegate will not call: not http(s), or resolving to a loopback, private,
    link-local or otherwise non-public address while private targets are not allowed."""


# -- upstream providers ------------------------------------------------------------------------

UpstreamErrorKind = Literal["rate_limited", "server", "timeout", "connection", "client", "malformed"]
"""How a provider call failed: 429; 408/409/5xx; no answer in time; the connection failed or was
cut; any other 4xx (the request itself is wrong); a 200 whose body is not what was asked for."""

# Only a request the provider called wrong fails the same way every time.
RETRYABLE_UPSTREAM_KINDS: frozenset[str] = frozenset(
    {"rate_limited", "server", "timeout", "connection", "malformed"}
)


class ClientClosed(Closed):
    """An upstream client was used before it was opened or after it was closed (a closed client
    cannot be reopened: make a new one)."""


@dataclass(frozen=True, slots=True)
class ProviderErrorBody:
    """What a provider's error answer said, in OpenAI's fields: its message (whitespace collapsed,
    truncated, never the API key), and its error type, code and param when it gave them."""

    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None


class UpstreamError(TidegateError):
    """A call to an AI provider failed.

    `kind` says how (see UpstreamErrorKind); `retryable` is False only for "client" errors, where
    sending the same request again cannot help; `retry_after_s` is the provider's own wait hint
    (Retry-After, else its rate-limit reset headers) when it gave one; `rate_limit` is what its
    headers said, when there was a response; `body` is the provider's own error, when it answered
    with an error status. The message carries the provider's own error message (truncated) and
    never the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: UpstreamErrorKind,
        status: int | None = None,
        retry_after_s: float | None = None,
        rate_limit: RateLimitInfo | None = None,
        body: ProviderErrorBody | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: UpstreamErrorKind = kind
        self.status = status
        self.retryable = kind in RETRYABLE_UPSTREAM_KINDS
        self.retry_after_s = retry_after_s
        self.rate_limit = rate_limit
        self.body = body


RoutingRefusal = Literal[
    "model_not_found", "model_not_allowed", "wrong_model_kind", "invalid_request", "model_not_available"
]
"""Why the router refused: the model named is not configured, not allowed for the tenant, or serves
the other kind of request; the request kind is unknown; or no model of the tier may serve it."""


class RoutingError(TidegateError):
    """No configured model may serve the request; the message names the model and why, and
    `refusal` says which rule refused it."""

    def __init__(self, message: str, *, refusal: RoutingRefusal = "model_not_available") -> None:
        super().__init__(message)
        self.refusal: RoutingRefusal = refusal


BudgetScope = Literal["tenant", "global"]
"""Which daily budget a BudgetExhausted is about."""


class BudgetExhausted(TidegateError):
    """A daily budget has no room for a reservation; nothing was recorded.

    `scope` is "tenant" or "global" (the tenant's budget is checked first), `remaining_micros`
    what is left of that budget today and `limit_micros` its daily limit."""

    def __init__(
        self, message: str, *, scope: BudgetScope, remaining_micros: int, limit_micros: int
    ) -> None:
        super().__init__(message)
        self.scope: BudgetScope = scope
        self.remaining_micros = remaining_micros
        self.limit_micros = limit_micros


class DispatchUnavailable(Unavailable):
    """The store shared by rate limiters or budget ledgers (Redis, SQLite) cannot be reached or
    answered with an error."""


class DispatchClosed(Closed):
    """A rate limiter or budget ledger was used after `close()`."""


# -- change flow -------------------------------------------------------------------------------


class InvalidChange(InvalidInput, ValueError):
    """A row value, key or change event that cannot become a `Change`; the message names the field."""


class SourceError(TidegateError):
    """The change source failed: replication connection, slot or publication, or the SQLite outbox."""


class BusUnavailable(Unavailable):
    """The event bus (Redis Streams, Kafka) cannot be reached or answered with an error."""


class CacheUnavailable(Unavailable):
    """The entity cache's store cannot be reached or answered with an error."""


class VersionConflict(Conflict):
    """An optimistic update expected a revision that is no longer current; nothing was written.

    `current_revision` is the entry's revision now (0 when the entity is not cached)."""

    def __init__(self, message: str, *, current_revision: int) -> None:
        super().__init__(message)
        self.current_revision = current_revision


# -- recommendations ---------------------------------------------------------------------------


class InvalidRecsInput(InvalidInput, ValueError):
    """An item, interaction or recommendation query the recommender refuses (nothing was
    written); the message names the field and what is wrong with it."""

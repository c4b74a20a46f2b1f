"""The demo's client side: everything goes through the gateway's HTTP API, as an application's
traffic would. Tenants and keys through the admin API; OpenAI-style chat and embeddings calls
(some streamed); async job batches through POST /v1/jobs, long-polled to their end; the queue's
numbers from GET /v1/stats; the demo user's recommendations and their freshness from
GET /v1/recommendations/{user} and GET /v1/health.

Every method that sends a request returns its final `Outcome`: an answer, a refusal with its
HTTP status, or the final state of a job that did not succeed. A call that answers 504 (no result
in time; the job goes on) is followed to its end by polling its job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from tidegate.demo.load import DemoTenant, Planned
from tidegate.demo.stats import OK, Outcome

__all__ = ["CONNECTIONS", "DemoClient"]

CONNECTIONS = 512  # open calls at most: above the deepest backlog of synchronous calls
CALL_TIMEOUT_S = 120.0  # the gateway answers 504 after its own 60 s; this only catches a hang
POLL_WAIT_S = 20.0  # one long-poll of GET /v1/jobs/{id}
POLL_ATTEMPTS = 5  # a poll that fails to connect is tried again this many times
POLL_PAUSE_S = 0.5
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled", "expired"})

Clock = Callable[[], float]  # seconds since the run started


class DemoError(Exception):
    """The demo could not set itself up through the admin API (a bug, or a broken gateway)."""


class DemoClient:
    """One aiohttp session to one gateway. Use as an async context manager."""

    def __init__(self, api_url: str, admin_key: str, clock: Clock) -> None:
        self.api_url = api_url.rstrip("/")
        self._admin_key = admin_key
        self._clock = clock
        self._keys: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DemoClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS),
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
            json_serialize=lambda value: orjson.dumps(value).decode(),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session."""
        if self._session is None:
            raise RuntimeError("DemoClient is not open: use it as an async context manager")
        return self._session

    # -- the admin API

    async def create_tenants(self, tenants: Sequence[DemoTenant], budget_usd: Decimal) -> None:
        """Create each tenant and one API key for it, through the admin API."""
        for tenant in tenants:
            await self._admin("PUT", f"/admin/tenants/{tenant.name}", tenant.body(budget_usd))
            created = await self._admin("POST", f"/admin/tenants/{tenant.name}/keys", None)
            self._keys[tenant.name] = str(created["api_key"])

    async def stats(self) -> dict[str, Any]:
        """GET /v1/stats with the admin key."""
        return await self._admin("GET", "/stats", None)

    async def recs_health(self) -> dict[str, Any]:
        """GET /v1/health: the recommender's size and freshness (any tenant's key would do)."""
        return await self._admin("GET", "/health", None)

    async def recommendations(self, user: str, n: int = 10) -> dict[str, Any]:
        """GET /v1/recommendations/{user}, explained."""
        return await self._admin("GET", f"/recommendations/{quote(user, safe='')}?n={n}&explain=true", None)

    async def _admin(self, method: str, path: str, body: object) -> dict[str, Any]:
        async with self.session.request(method, self.api_url + path, json=body,
                                        headers=_bearer(self._admin_key)) as response:
            data = await response.read()
            if response.status >= 300:
                raise DemoError(f"{method} {path} answered {response.status}: {data[:300]!r}")
        document = orjson.loads(data)
        if not isinstance(document, dict):
            raise DemoError(f"{method} {path} answered {document!r}")
        return document

    # -- synchronous calls

    async def call(self, planned: Planned) -> Outcome:
        """Send one chat or embeddings call (streamed when planned so) and wait for its answer."""
        path = "/chat/completions" if planned.kind == "chat" else "/embeddings"
        headers = {**_bearer(self._keys[planned.tenant]), "X-Priority": planned.priority.name.lower()}
        started = time.perf_counter()
        try:
            async with self.session.post(self.api_url + path, json=planned.body,
                                         headers=headers) as response:
                if response.status == 200 and planned.mode == "stream":
                    return await self._streamed(planned, response, started)
                data = await response.read()
                if response.status == 200:
                    return self._answered(planned, response.headers, started)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._outcome(planned, "connection error", error=repr(exc))
        message, job_id = _error_of(data)
        if response.status == 504 and job_id is not None:
            # No result within the gateway's wait; the job goes on, so follow it to its end.
            return await self.poll(planned, job_id)
        return self._outcome(planned, str(response.status), error=message)

    def _answered(self, planned: Planned, headers: Mapping[str, str], started: float) -> Outcome:
        return self._outcome(
            planned, OK, model=headers.get("X-Tidegate-Model"),
            cost_usd=_decimal(headers.get("X-Tidegate-Cost-Usd")),
            wait_ms=_float(headers.get("X-Tidegate-Queue-Wait-Ms")),
            e2e_ms=(time.perf_counter() - started) * 1000,
        )

    async def _streamed(self, planned: Planned, response: aiohttp.ClientResponse,
                        started: float) -> Outcome:
        """Read the server-sent events to [DONE] (or an error event), then the job for its wait
        and cost, which a stream's headers cannot carry: they leave before the call ends."""
        error: str | None = None
        done = False
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):].strip()
            if data == b"[DONE]":
                done = True
                break
            event = orjson.loads(data)
            if isinstance(event, dict) and "error" in event:
                error = str(event["error"].get("message", event["error"]))
        e2e_ms = (time.perf_counter() - started) * 1000
        if error is not None or not done:
            return self._outcome(planned, "stream error", error=error or "the stream ended early")
        job_id = response.headers.get("X-Tidegate-Job-Id")
        job = await self._get_job(job_id, wait_s=10.0) if job_id else None
        if job is None or job.get("state") != "succeeded":
            return self._outcome(planned, OK, model=response.headers.get("X-Tidegate-Model"),
                                 e2e_ms=e2e_ms)
        return self._outcome(planned, OK, model=job.get("model"), cost_usd=_decimal(job.get("cost_usd")),
                             wait_ms=_float((job.get("timings") or {}).get("queue_wait_ms")), e2e_ms=e2e_ms)

    # -- asynchronous jobs

    async def submit(self, batch: Sequence[Planned]) -> list[str | Outcome]:
        """POST one tenant's batch of jobs to /v1/jobs: per job, its id, or, when the batch
        was refused (all or none), its outcome."""
        tenant = batch[0].tenant
        jobs = [{"kind": p.kind, "priority": p.priority.name.lower(), "body": p.body} for p in batch]
        try:
            async with self.session.post(self.api_url + "/jobs", json={"jobs": jobs},
                                         headers=_bearer(self._keys[tenant])) as response:
                data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return [self._outcome(p, "connection error", error=repr(exc)) for p in batch]
        if response.status != 202:
            message, _ = _error_of(data)
            return [self._outcome(p, str(response.status), error=message) for p in batch]
        ids = orjson.loads(data)["ids"]
        if len(ids) != len(batch):
            raise DemoError(f"POST /v1/jobs accepted {len(batch)} jobs but answered {len(ids)} ids")
        return [str(job_id) for job_id in ids]

    async def poll(self, planned: Planned, job_id: str) -> Outcome:
        """Long-poll a job until it is final; its outcome."""
        while True:
            job = await self._get_job(job_id, wait_s=POLL_WAIT_S, tenant=planned.tenant)
            if job is None:
                return self._outcome(planned, "connection error",
                                     error=f"GET /v1/jobs/{job_id} failed {POLL_ATTEMPTS} times")
            state = str(job.get("state"))
            if state in FINAL_STATES:
                return self._job_outcome(planned, job, state)

    def _job_outcome(self, planned: Planned, job: Mapping[str, Any], state: str) -> Outcome:
        created, finished = job.get("created_at"), job.get("finished_at")
        e2e_ms = None
        if isinstance(created, str) and isinstance(finished, str):
            lifetime = datetime.fromisoformat(finished) - datetime.fromisoformat(created)
            e2e_ms = lifetime.total_seconds() * 1000
        succeeded = state == "succeeded"
        model = job.get("model")
        return self._outcome(
            planned, OK if succeeded else state, model=model if isinstance(model, str) else None,
            cost_usd=_decimal(job.get("cost_usd")),
            wait_ms=_float((job.get("timings") or {}).get("queue_wait_ms")), e2e_ms=e2e_ms,
            error=None if succeeded else str(job.get("last_error")),
        )

    async def _get_job(self, job_id: str, *, wait_s: float,
                       tenant: str | None = None) -> dict[str, Any] | None:
        """GET /v1/jobs/{id}?wait=…, tried again when it fails to connect; None if it never
        answers 200."""
        key = self._keys[tenant] if tenant is not None else self._admin_key
        url = f"{self.api_url}/jobs/{job_id}"
        for _ in range(POLL_ATTEMPTS):
            try:
                async with self.session.get(url, params={"wait": f"{wait_s:g}"},
                                            headers=_bearer(key)) as response:
                    data = await response.read()
                if response.status == 200:
                    document = orjson.loads(data)
                    return document if isinstance(document, dict) else None
                raise DemoError(f"GET /v1/jobs/{job_id} answered {response.status}: {data[:300]!r}")
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(POLL_PAUSE_S)
        return None

    def _outcome(self, planned: Planned, result: str, **fields: Any) -> Outcome:
        return Outcome(number=planned.number, mode=planned.mode, priority=planned.priority,
                       tenant=planned.tenant, result=result, finished_s=self._clock(), **fields)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _error_of(data: bytes) -> tuple[str, str | None]:
    """The message and job id of an OpenAI-shaped error answer."""
    try:
        error = orjson.loads(data).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return data[:300].decode(errors="replace"), None
    job_id = error.get("job_id")
    return str(error.get("message", "")), job_id if isinstance(job_id, str) else None


def _decimal(value: object) -> Decimal:
    try:
        return Decimal(str(value)) if isinstance(value, str | int | float) else Decimal(0)
    except InvalidOperation:
        return Decimal(0)


def _float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None

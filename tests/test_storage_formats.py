"""Storage formats: every store records its format when it opens, a store of 0.1.0 (no format at
all) is migrated with its data intact, a store newer than the code is refused with both versions
named and nothing changed, `[storage] migrate = "check"` refuses pending migrations, `tidegate
migrate` reports and applies them, and payloads and results carry their format — on SQLite,
Redis and Redis Cluster."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support.dispatch import chat, running_worker, sim_config
from support.redis_keys import REDIS_BACKENDS, delete_keys, redis_client, redis_url_of
from support.waiting import eventually
from tidegate._formats import FORMATS_TABLE, SQLITE_LAYOUT, migrating
from tidegate.ai import PAYLOAD_FORMAT, RESULT_FORMAT, AIRequest, AIResult
from tidegate.app.storage import store_formats
from tidegate.cli.main import app
from tidegate.config import StorageSettings, TidegateConfig
from tidegate.coord.tenants import tenant_store_for
from tidegate.coord.tenants.models import Tenant
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.errors import InvalidJob, PayloadFormatError, StoreFormatError
from tidegate.jobs import JobState
from tidegate.queue import Queue

BACKENDS = ["sqlite", "redis", "redis-cluster"]
NEWER = 99
QUEUE = 2  # the queue's format since jobs say whether a caller waits for them
TENANTS = 2  # the tenant store's since keys carry limits of their own


@pytest.fixture(params=BACKENDS)
async def queue_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A queue URL of the test's own: a SQLite file, or a queue name on Redis / Redis Cluster."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tidegate.db'}"
        return
    server = redis_url_of(request, request.param)
    name = f"fmt{uuid.uuid4().hex[:10]}"
    try:
        yield f"{server}?name={name}"
    finally:
        await delete_keys(server, f"*{name}*")


def _name(url: str) -> str:
    return url.partition("?name=")[2]


async def _write_some(url: str) -> str:
    """A job in the queue and a tenant in the tenant store; the job's id."""
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        job_id = await queue.enqueue(chat("hello"), tenant="acme")
    async with tenant_store_for(url) as tenants:
        await tenants.put_tenant(Tenant(name="acme"))
    return job_id


async def _formats(url: str) -> dict[str, int | None]:
    """Each store's recorded format, read straight from the storage (None: none recorded)."""
    stores = ("queue", "tenants")
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            table = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (FORMATS_TABLE,)).fetchone()
            found = conn.execute(f"SELECT store, version FROM {FORMATS_TABLE}").fetchall() if table else []
        rows = dict(found)
        return {store: rows.get(store) for store in stores}
    redis = redis_client(url.partition("?")[0])
    try:
        raw = await redis.hmget(f"tidegate:{{{_name(url)}}}:formats", list(stores))
    finally:
        await redis.aclose()
    return {store: None if value is None else int(value) for store, value in zip(stores, raw, strict=True)}


async def _set_formats(url: str, version: int | None) -> None:
    """Record `version` for the queue and tenants stores; None makes them 0.1.0's: no format."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            if version is None:
                conn.execute(f"DROP TABLE {FORMATS_TABLE}")
                conn.execute("PRAGMA user_version = 0")
            else:
                conn.execute(f"UPDATE {FORMATS_TABLE} SET version = ?", (version,))
        return
    redis = redis_client(url.partition("?")[0])
    key = f"tidegate:{{{_name(url)}}}:formats"
    try:
        if version is None:
            await redis.delete(key)
        else:
            await redis.hset(key, mapping={"queue": version, "tenants": version})
    finally:
        await redis.aclose()


async def test_a_new_store_is_stamped_with_the_code_s_format(queue_url: str) -> None:
    await _write_some(queue_url)

    assert await _formats(queue_url) == {"queue": QUEUE, "tenants": TENANTS}
    if queue_url.startswith("sqlite"):
        with sqlite3.connect(queue_url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_LAYOUT


async def test_a_store_without_a_format_is_migrated_on_open_with_its_data_intact(queue_url: str) -> None:
    # Given data as 0.1.0 left it: the same layout, no format recorded anywhere
    job_id = await _write_some(queue_url)
    await _set_formats(queue_url, None)
    reports = {r.store: r for r in await store_formats(TidegateConfig(queue_url=queue_url), apply=False)}
    assert (reports["queue"].found, reports["queue"].outcome) == (0, "pending")

    # When this release opens it
    async with Queue.from_url(queue_url, maintenance_interval_s=None) as queue:
        job = await queue.get(job_id)
    async with tenant_store_for(queue_url) as tenants:
        tenant = await tenants.get_tenant("acme")

    # Then it is migrated to the code's formats and everything reads as before
    assert await _formats(queue_url) == {"queue": QUEUE, "tenants": TENANTS}
    assert job is not None and job.payload == chat("hello") and job.state is JobState.QUEUED
    assert tenant is not None and tenant.name == "acme"


async def test_a_store_newer_than_the_code_is_refused_and_left_unchanged(queue_url: str) -> None:
    job_id = await _write_some(queue_url)
    await _set_formats(queue_url, NEWER)

    with pytest.raises(StoreFormatError) as refused:
        async with Queue.from_url(queue_url, maintenance_interval_s=None) as queue:
            await queue.get(job_id)
    with pytest.raises(StoreFormatError):
        async with tenant_store_for(queue_url) as tenants:
            await tenants.get_tenant("acme")

    message = str(refused.value)
    assert f"format {NEWER}" in message and f"format {QUEUE}" in message and "upgrade tidegate" in message
    assert (refused.value.found, refused.value.readable) == (NEWER, QUEUE)
    where = queue_url.removeprefix("sqlite:///") if queue_url.startswith("sqlite") else ":formats)"
    assert where in message  # where the store is
    assert await _formats(queue_url) == {"queue": NEWER, "tenants": NEWER}
    await _set_formats(queue_url, 1)  # the job is still there, as it was
    async with Queue.from_url(queue_url, maintenance_interval_s=None) as queue:
        job = await queue.get(job_id)
    assert job is not None and job.state is JobState.QUEUED


async def test_check_mode_refuses_a_store_with_pending_migrations(queue_url: str) -> None:
    job_id = await _write_some(queue_url)
    await _set_formats(queue_url, None)

    with migrating("check"):
        queue = Queue.from_url(queue_url, maintenance_interval_s=None)
    with pytest.raises(StoreFormatError, match="tidegate migrate --apply"):
        async with queue:
            await queue.get(job_id)

    assert await _formats(queue_url) == {"queue": None, "tenants": None}


async def test_check_mode_opens_a_current_store(queue_url: str) -> None:
    job_id = await _write_some(queue_url)

    with migrating("check"):
        queue = Queue.from_url(queue_url, maintenance_interval_s=None)
    async with queue:
        assert await queue.get(job_id) is not None


def test_the_storage_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_STORAGE__MIGRATE", "check")
    assert TidegateConfig.load().storage == StorageSettings(migrate="check")
    monkeypatch.setenv("TIDEGATE_STORAGE__MIGRATE", "sometimes")
    with pytest.raises(Exception, match="storage"):
        TidegateConfig.load()


async def test_migrate_check_and_apply_from_the_command_line(queue_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    await _write_some(queue_url)
    await _set_formats(queue_url, None)
    monkeypatch.setenv("TIDEGATE_QUEUE_URL", queue_url)
    monkeypatch.setenv("TIDEGATE_CONFIG", str(tmp_path / "none.toml"))
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, ["migrate", *args], prog_name="tidegate")

    pending = await asyncio.to_thread(cli, "--check")
    assert pending.exit_code == 1, pending.output
    assert "queue at" in pending.output and f"format 0, code format {QUEUE}: pending" in pending.output
    assert await _formats(queue_url) == {"queue": None, "tenants": None}  # --check changes nothing

    applied = await asyncio.to_thread(cli, "--apply")
    assert applied.exit_code == 0, applied.output
    assert "migrated" in applied.output and "ran: record the queue" in applied.output
    assert await _formats(queue_url) == {"queue": QUEUE, "tenants": TENANTS}

    current = await asyncio.to_thread(cli, "--check")
    assert current.exit_code == 0, current.output
    await _set_formats(queue_url, NEWER)
    newer = await asyncio.to_thread(cli, "--apply")
    assert newer.exit_code == 1 and f"format {NEWER}, code format {QUEUE}: newer" in newer.output
    assert await _formats(queue_url) == {"queue": NEWER, "tenants": NEWER}


def test_migrate_needs_check_or_apply() -> None:
    done = CliRunner().invoke(app, ["migrate"], prog_name="tidegate")
    assert done.exit_code == 2


_OPEN_AND_ENQUEUE = """
import asyncio, sys
from tidegate.queue import Queue
async def main():
    async with Queue.from_url(sys.argv[1], maintenance_interval_s=None) as queue:
        await queue.enqueue({"n": sys.argv[2]})
asyncio.run(main())
"""


def test_processes_opening_one_new_sqlite_file_at_once_record_its_formats_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AND_ENQUEUE, url, str(n)],
                              stderr=subprocess.PIPE) for n in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()

    with sqlite3.connect(tmp_path / "new.db") as conn:
        assert conn.execute(f"SELECT store, version FROM {FORMATS_TABLE}").fetchall() == [("queue", QUEUE)]
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 4


def test_a_sqlite_file_of_a_newer_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SQLITE_LAYOUT + 1}")

    async def open_it() -> None:
        async with Queue.from_url(f"sqlite:///{path}") as queue:
            await queue.stats()

    with pytest.raises(StoreFormatError, match=f"layout {SQLITE_LAYOUT + 1}"):
        asyncio.run(open_it())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
async def test_the_recommender_store_and_entity_cache_refuse_a_newer_format(
        request: pytest.FixtureRequest, backend: str) -> None:
    from tidegate.recs.store import recs_store_for
    from tidegate.sync.cache import cache_for

    url = redis_url_of(request, backend)
    prefix = f"fmt{uuid.uuid4().hex[:10]}"
    try:
        async with recs_store_for(url, prefix=prefix), cache_for(url, prefix=prefix):
            pass  # new: stamped
        redis = redis_client(url)
        try:
            assert await redis.hget(f"{{{prefix}:recs}}:formats", "recs") == b"1"
            assert await redis.hget(f"{prefix}:sync:formats", "entity_cache") == b"1"
            await redis.hset(f"{{{prefix}:recs}}:formats", "recs", NEWER)
            await redis.hset(f"{prefix}:sync:formats", "entity_cache", NEWER)
        finally:
            await redis.aclose()
        with pytest.raises(StoreFormatError, match=f"format {NEWER}"):
            async with recs_store_for(url, prefix=prefix):
                pass
        with pytest.raises(StoreFormatError, match=f"format {NEWER}"):
            async with cache_for(url, prefix=prefix):
                pass
    finally:
        await delete_keys(url, f"*{prefix}*")


# -- payloads and results -----------------------------------------------------------------------


def test_a_payload_is_written_in_0_1_0_s_form_and_read_with_or_without_its_format() -> None:
    request = AIRequest.from_payload(chat("hi"))
    payload = request.to_payload()

    # 0.1.0's workers refuse unknown fields: format 1 is written without "v"
    assert PAYLOAD_FORMAT == 1 and "v" not in payload
    assert AIRequest.from_payload({**payload, "v": 1}) == request
    with pytest.raises(PayloadFormatError, match="format 2") as newer:
        AIRequest.from_payload({**payload, "v": 2, "new_field": True})
    assert (newer.value.found, newer.value.readable) == (2, 1)
    with pytest.raises(InvalidJob):
        AIRequest.from_payload({**payload, "v": "one"})


def test_a_result_carries_its_format_and_one_newer_than_the_code_is_refused() -> None:
    document = AIResult(response={"choices": []}, model="m").to_json()

    assert document["v"] == RESULT_FORMAT
    assert AIResult.from_json(document) == AIResult.from_json({k: v for k, v in document.items() if k != "v"})
    with pytest.raises(PayloadFormatError):
        AIResult.from_json({**document, "v": RESULT_FORMAT + 1})


async def test_a_worker_leaves_a_job_with_a_newer_payload_for_a_newer_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    metrics = DispatchMetrics()
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        job_id = await queue.enqueue({**chat("from the future"), "v": PAYLOAD_FORMAT + 1})
        # No provider is reachable: a worker that tried to serve the job would fail it.
        async with running_worker(queue, sim_config("http://127.0.0.1:9/v1", queue_url=url), metrics=metrics):
            await eventually(lambda: queue.get(job_id), "the worker defers the job",
                             until=lambda job: job is not None and job.state is JobState.DELAYED)
        job = await queue.get(job_id)

    assert job is not None and job.state is JobState.DELAYED, job
    assert job.attempts == 0 and job.last_error is not None and "format 2" in job.last_error
    assert metrics.deferred.labels("newer_payload")._value.get() == 1

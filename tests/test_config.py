"""The configuration: every process's settings is a section of tidegate.toml, overlaid by
TIDEGATE_* variables (nested with `__`), and the process takes its section when it is given none."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tidegate.app.components import Given, open_worker_parts
from tidegate.app.gateway import open_gateway_state
from tidegate.app.recs import open_recommendations
from tidegate.config import (
    GatewaySettings,
    PipelineSettings,
    RecsSettings,
    TidegateConfig,
    UpSettings,
    VerifySettings,
    WorkerSettings,
)
from tidegate.dispatch.worker import Worker
from tidegate.errors import ConfigError
from tidegate.jobs import Priority
from tidegate.queue import Queue

SECTIONS = """
[worker]
concurrency = 4
lease_s = 12.5
priorities = [0, 1]

[gateway]
port = 9123
max_batch = 7

[up]
concurrency = 3
change_flow = false

[recs]
dimension = 16
weight_repeat = 1.5

[sync]
group = "shop-sync"

[sync.pipeline]
batch_size = 50
max_pending_changes = 400

[sync.verify]
rounds = 5
max_rows_per_s = 100.0
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tidegate.toml of the test's own, named by TIDEGATE_CONFIG (written by the test)."""
    path = tmp_path / "tidegate.toml"
    monkeypatch.setenv("TIDEGATE_CONFIG", str(path))
    return path


@pytest.fixture
def sections(config_file: Path) -> Path:
    """The test's tidegate.toml, holding SECTIONS."""
    config_file.write_text(SECTIONS)
    return config_file


def test_every_section_is_read_from_the_file_and_the_environment_wins(
    sections: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDEGATE_WORKER__CONCURRENCY", "9")

    config = TidegateConfig.load()

    assert config.worker == WorkerSettings(concurrency=9, lease_s=12.5, priorities=(0, 1))
    assert config.gateway == GatewaySettings(port=9123, max_batch=7)
    assert config.up == UpSettings(concurrency=3, change_flow=False)
    assert config.recs == RecsSettings(dimension=16, weight_repeat=1.5)
    pipeline = config.sync.pipeline
    assert (pipeline.group, pipeline.batch_size, pipeline.max_pending_changes) == ("shop-sync", 50, 400)
    assert config.sync.verify == VerifySettings(rounds=5, max_rows_per_s=100.0)


def test_the_sync_sections_group_and_batch_size_stay_the_pipelines_defaults(config_file: Path) -> None:
    config_file.write_text('[sync]\ngroup = "other"\nbatch_size = 64\n')

    pipeline = TidegateConfig.load().sync.pipeline

    assert (pipeline.group, pipeline.batch_size) == ("other", 64)


def test_without_a_file_every_section_has_its_defaults(config_file: Path) -> None:
    config = TidegateConfig.load()

    assert config.worker == WorkerSettings()
    assert config.gateway == GatewaySettings()
    assert config.recs == RecsSettings()
    assert config.sync.pipeline.model_dump(exclude={"consumer"}) == \
        PipelineSettings().model_dump(exclude={"consumer"})


def test_an_unknown_key_is_refused_with_its_place(config_file: Path) -> None:
    config_file.write_text("[worker]\nconcurency = 4\n")

    with pytest.raises(ConfigError, match=r"worker\.concurency\s+Extra inputs are not permitted"):
        TidegateConfig.load()


def test_a_value_a_section_cannot_work_with_is_refused(
    config_file: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDEGATE_WORKER__CONCURRENCY", "0")
    with pytest.raises(ConfigError, match=r"worker\.concurrency"):
        TidegateConfig.load()
    monkeypatch.delenv("TIDEGATE_WORKER__CONCURRENCY")
    config_file.write_text("[recs]\ntrending_decay_hours = 0\n")
    with pytest.raises(ConfigError, match="recommender setting trending_decay_hours"):
        TidegateConfig.load()


def test_the_gateways_own_variables_still_set_it_below_the_nested_ones(
    config_file: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config_file.write_text("[gateway]\nport = 9000\nmax_messages = 5\n")
    monkeypatch.setenv("TIDEGATE_GATEWAY_PORT", "9001")
    monkeypatch.setenv("TIDEGATE_GATEWAY_MAX_BATCH", "3")
    monkeypatch.setenv("TIDEGATE_GATEWAY__MAX_BATCH", "4")

    gateway = TidegateConfig.load().gateway

    assert (gateway.port, gateway.max_batch, gateway.max_messages) == (9001, 4, 5)


def test_flags_given_go_over_the_section_and_flags_left_out_keep_it(sections: Path) -> None:
    worker = TidegateConfig.load().worker

    assert worker.given(concurrency=None, lease_s=None) is worker
    assert worker.given(concurrency=2, lease_s=None) == worker.model_copy(update={"concurrency": 2})
    with pytest.raises(ConfigError, match="concurrency"):
        worker.given(concurrency=0)


def test_the_worker_s_urgent_reserve_is_read_by_level_name_and_must_leave_other_levels_a_slot(
    config_file: Path,
) -> None:
    config_file.write_text('[worker]\nconcurrency = 8\nurgent_reserve = 2\nurgent_level = "critical"\n')
    worker = TidegateConfig.load().worker
    assert (worker.reserved_slots(), worker.urgent_level) == (2, Priority.CRITICAL)
    # A copy made without validation (as `tidegate up` sets its concurrency) is clamped
    assert worker.model_copy(update={"concurrency": 2}).reserved_slots() == 1
    with pytest.raises(ConfigError, match="urgent_reserve"):
        worker.given(concurrency=2)
    # The default: a sixteenth of the slots, rounded down, at most 4
    assert [WorkerSettings(concurrency=n).reserved_slots() for n in (8, 16, 64, 256)] == [0, 1, 4, 4]

    config_file.write_text("[worker]\nconcurrency = 4\nurgent_reserve = 4\n")
    with pytest.raises(ConfigError, match="urgent_reserve"):
        TidegateConfig.load()
    config_file.write_text('[worker]\nurgent_level = "urgent"\n')
    with pytest.raises(ConfigError, match="urgent_level"):
        TidegateConfig.load()


def test_settings_are_frozen_and_refuse_unknown_keywords() -> None:
    with pytest.raises(ValueError, match="frozen"):
        WorkerSettings().concurrency = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="Extra inputs"):
        WorkerSettings(concurency=3)  # type: ignore[call-arg]


def test_the_old_import_paths_name_the_same_classes() -> None:
    from tidegate.app.up import UpSettings as UpFromApp
    from tidegate.dispatch.worker import WorkerSettings as WorkerFromDispatch
    from tidegate.gateway.core.settings import GatewaySettings as GatewayFromGateway
    from tidegate.recs import RecsSettings as RecsFromRecs
    from tidegate.sync.pipeline import PipelineSettings as PipelineFromSync
    from tidegate.sync.verify import VerifySettings as VerifyFromSync

    assert (WorkerFromDispatch, GatewayFromGateway, UpFromApp, RecsFromRecs, PipelineFromSync,
            VerifyFromSync) == (WorkerSettings, GatewaySettings, UpSettings, RecsSettings,
                                PipelineSettings, VerifySettings)


async def test_processes_given_no_settings_take_their_sections(sections: Path, tmp_path: Path) -> None:
    config = TidegateConfig.load(queue_url=f"sqlite:///{tmp_path}/tidegate.db")

    async with contextlib.AsyncExitStack() as stack:
        queue = await stack.enter_async_context(Queue.from_url(config.queue_url))
        parts = await stack.enter_async_context(open_worker_parts(config, queue))
        worker = await stack.enter_async_context(Worker(parts, config))
        state = await stack.enter_async_context(open_gateway_state(config, given=Given(queue=queue)))
        recs = await open_recommendations(stack, config, queue=None, cache=None)

        assert worker.settings == config.worker
        assert state.settings == config.gateway
        assert recs.sink.recommender.settings == config.recs


def test_a_provider_names_the_client_apis_it_serves_natively(config_file: Path) -> None:
    config_file.write_text('[[providers]]\nname = "openai"\nbase_url = "https://api.openai.com/v1"\n'
                           'native_apis = ["responses"]\n\n'
                           '[[providers]]\nname = "claude"\nbase_url = "https://api.anthropic.com/v1"\n'
                           'api = "anthropic"\n')

    openai, claude = TidegateConfig.load().providers

    assert openai.native_apis == ("responses",) and openai.speaks("responses")
    assert not openai.speaks("anthropic")
    assert claude.speaks("anthropic") and not claude.speaks("responses")
    config_file.write_text('[[providers]]\nname = "claude"\nbase_url = "https://api.anthropic.com/v1"\n'
                           'api = "anthropic"\nnative_apis = ["responses"]\n')
    with pytest.raises(ConfigError, match="native_apis"):
        TidegateConfig.load()

"""The simulated provider over loopback, spoken to with a plain HTTP client: the OpenAI shapes,
validation, seeded determinism, its own rate limit, faults, the /_sim/ control endpoints and
the `tidegate simulate` command."""

from __future__ import annotations

import asyncio
import base64
import math
import os
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from typer.testing import CliRunner

from tidegate.cli.main import app
from tidegate.config import TidegateConfig
from tidegate.errors import ConfigError
from tidegate.simulator import Simulator, SimulatorSettings
from tidegate.simulator.catalogue import default_models, legacy_models, with_simulator

CHAT_MODEL = "deepseek-v3.2"
EMBEDDING_MODEL = "text-embedding-3-small"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


class Api:
    """A plain aiohttp session on one running simulator, returning (status, headers, JSON)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url
        self.root = base_url.removesuffix("/v1")

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        data = raw if raw is not None else orjson.dumps(body)
        url = (self.root if path.startswith("/_sim") else self.base_url) + path
        async with self.session.post(url, data=data, headers=headers) as response:
            return response.status, response.headers, orjson.loads(await response.read())

    async def get(self, path: str, *, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        url = (self.root if path.startswith("/_sim") else self.base_url) + path
        async with self.session.get(url, headers=headers) as response:
            return response.status, orjson.loads(await response.read())

    async def chat(self, **extra: Any) -> tuple[int, Any, Any]:
        return await self.post("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES, **extra})


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5))


@pytest.fixture
async def api(simulator: Simulator) -> AsyncIterator[Api]:
    async with simulator.running() as base_url, aiohttp.ClientSession() as session:
        yield Api(session, base_url)


# ---------------------------------------------------------------------------- the API


async def test_models_are_the_price_table_plus_extra_names() -> None:
    extra = {"local-llama": {}, "local-embed": {"kind": "embeddings"}}
    simulator = Simulator(SimulatorSettings(models=extra))
    async with simulator.running() as base_url, aiohttp.ClientSession() as session:
        api = Api(session, base_url)
        status, body = await api.get("/models")
        embed_status, _, embedded = await api.post("/embeddings", {"model": "local-embed", "input": "x"})

    assert status == 200 and body["object"] == "list"
    names = {model["id"] for model in body["data"]}
    assert names == {m.name for m in (*default_models(), *legacy_models())} | {"local-llama", "local-embed"}
    assert embed_status == 200 and len(embedded["data"][0]["embedding"]) == 256


async def test_a_chat_completion_has_the_openai_shape_and_realistic_usage(api: Api) -> None:
    status, headers, body = await api.chat(max_tokens=5)
    _, _, longer = await api.chat(messages=[{"role": "user", "content": "word " * 400}])

    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == CHAT_MODEL and isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["completion_tokens"] == len(choice["message"]["content"].split()) <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # ~4 characters per token plus a few per message: 2000 characters are about 500 tokens.
    assert 495 <= longer["usage"]["prompt_tokens"] <= 515
    assert usage["prompt_tokens"] < 20


async def test_completion_lengths_follow_the_distribution_and_respect_max_tokens(
    simulator: Simulator, api: Api
) -> None:
    simulator.configure({"defaults": {"completion_tokens": 30, "completion_tokens_p99": 200}})

    lengths = [(await api.chat())[2]["usage"]["completion_tokens"] for _ in range(40)]
    capped = [(await api.chat(max_tokens=10))[2] for _ in range(10)]

    assert len(set(lengths)) > 5  # a distribution, not a constant
    assert 10 <= sorted(lengths)[20] <= 90  # around the median
    assert all(c["usage"]["completion_tokens"] <= 10 for c in capped)
    assert all(c["choices"][0]["finish_reason"] == ("length" if c["usage"]["completion_tokens"] == 10
                                                    else "stop") for c in capped)


async def test_a_stream_is_openai_chunks_then_usage_then_done(api: Api) -> None:
    body = {"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    async with api.session.post(api.base_url + "/chat/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = (await response.read()).decode().split("\n\n")

    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [orjson.loads(event.removeprefix("data: ")) for event in events[:-2]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    words = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(words.split()) <= 4


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"sku": {"type": "integer"},
                                     "size": {"type": "string", "enum": ["s", "m"]},
                                     "gift": {"type": ["boolean", "null"]}}}}}


async def test_a_request_with_tools_calls_one_until_a_tool_has_answered(api: Api) -> None:
    status, _, called = await api.chat(tools=[TOOL])
    assert status == 200
    choice = called["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", None)
    assert call["function"]["name"] == "lookup" and call["id"].startswith("call_")
    assert orjson.loads(call["function"]["arguments"]) == {"sku": 1, "size": "s", "gift": True}

    answered = [*MESSAGES, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "7"}]
    status, _, after = await api.chat(tools=[TOOL], messages=answered)
    assert status == 200 and after["choices"][0]["message"]["content"]
    status, _, unused = await api.chat(tools=[TOOL], tool_choice="none")
    assert unused["choices"][0]["message"]["content"]
    status, _, refused = await api.chat(tools=[{"type": "web_search"}])
    assert status == 400 and refused["error"]["param"] == "tools[0]"


async def test_a_streamed_tool_call_sends_its_name_then_its_arguments_in_pieces(api: Api) -> None:
    body = {"model": CHAT_MODEL, "messages": MESSAGES, "tools": [TOOL], "stream": True}
    async with api.session.post(api.base_url + "/chat/completions", json=body) as response:
        events = (await response.read()).decode().split("\n\n")

    chunks = [orjson.loads(event.removeprefix("data: ")) for event in events[:-2]]
    calls = [call for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls", ())]
    assert calls[0]["function"] == {"name": "lookup", "arguments": ""} and calls[0]["id"]
    assert orjson.loads("".join(call["function"]["arguments"] for call in calls))["sku"] == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_without_include_usage_a_stream_sends_no_usage_chunk(api: Api) -> None:
    body = {"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    async with api.session.post(api.base_url + "/chat/completions", json=body) as response:
        text = (await response.read()).decode()

    assert '"usage"' not in text and text.endswith("data: [DONE]\n\n")


async def test_embeddings_are_deterministic_unit_vectors(api: Api) -> None:
    _, _, first = await api.post("/embeddings", {"model": EMBEDDING_MODEL, "input": ["red shoe", "blue hat"]})
    _, _, again = await api.post("/embeddings", {"model": EMBEDDING_MODEL, "input": "red shoe"})
    _, _, short = await api.post("/embeddings", {"model": EMBEDDING_MODEL, "input": [[1, 2, 3]],
                                                  "dimensions": 8, "encoding_format": "base64"})

    red, blue = (item["embedding"] for item in first["data"])
    assert [item["index"] for item in first["data"]] == [0, 1]
    assert len(red) == 256 and math.isclose(math.fsum(v * v for v in red), 1.0, rel_tol=1e-4)
    assert again["data"][0]["embedding"] == red and red != blue
    assert first["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    decoded = struct.unpack("<8f", base64.b64decode(short["data"][0]["embedding"]))
    assert math.isclose(math.fsum(v * v for v in decoded), 1.0, rel_tol=1e-4)
    assert short["usage"]["prompt_tokens"] == 3


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": 42, "messages": MESSAGES}, "model"),
        ({"model": CHAT_MODEL}, "messages"),
        ({"model": CHAT_MODEL, "messages": "hello"}, "messages"),
        ({"model": CHAT_MODEL, "messages": []}, "messages"),
        ({"model": CHAT_MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": CHAT_MODEL, "messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": "ten"}, "max_tokens"),
        ({"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"model": CHAT_MODEL, "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": CHAT_MODEL, "messages": MESSAGES, "stream_options": {"include_usage": True}},
         "stream_options"),
        ({"model": CHAT_MODEL, "messages": MESSAGES, "temperature": 3}, "temperature"),
    ],
)
async def test_invalid_chat_requests_get_openai_shaped_400s(
    api: Api, body: dict[str, Any], param: str
) -> None:
    status, _, answer = await api.post("/chat/completions", body)

    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param
    assert answer["error"]["message"]


@pytest.mark.parametrize(
    ("path", "raw", "status"),
    [
        ("/chat/completions", b"{not json", 400),
        ("/chat/completions", b"[1, 2]", 400),
        ("/chat/completions", orjson.dumps({"model": "gpt-9", "messages": MESSAGES}), 404),
        ("/chat/completions", orjson.dumps({"model": EMBEDDING_MODEL, "messages": MESSAGES}), 400),
        ("/embeddings", orjson.dumps({"model": EMBEDDING_MODEL}), 400),
        ("/embeddings", orjson.dumps({"model": EMBEDDING_MODEL, "input": [""]}), 400),
        ("/embeddings", orjson.dumps({"model": EMBEDDING_MODEL, "input": [1.5]}), 400),
        ("/embeddings", orjson.dumps({"model": CHAT_MODEL, "input": "x"}), 400),
        ("/embeddings",
         orjson.dumps({"model": EMBEDDING_MODEL, "input": "x", "encoding_format": "hex"}), 400),
    ],
)
async def test_malformed_requests_and_unknown_models_are_refused(
    api: Api, path: str, raw: bytes, status: int
) -> None:
    got, _, answer = await api.post(path, raw=raw)

    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"}


async def test_an_api_key_is_required_when_configured(simulator: Simulator, api: Api) -> None:
    simulator.configure({"require_api_key": "sk-sim-123"})

    missing = await api.chat()
    wrong = await api.post("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES},
                           headers={"Authorization": "Bearer sk-other"})
    right = await api.post("/chat/completions", {"model": CHAT_MODEL, "messages": MESSAGES},
                           headers={"Authorization": "Bearer sk-sim-123"})
    models = await api.get("/models")

    assert missing[0] == wrong[0] == models[0] == 401
    assert wrong[2]["error"]["code"] == "invalid_api_key"
    assert "sk-other" not in wrong[2]["error"]["message"]
    assert right[0] == 200


# ---------------------------------------------------------------------------- determinism


async def _transcript(seed: int) -> list[Any]:
    settings = SimulatorSettings(seed=seed, defaults={"error_rate": 0.3, "latency_ms": 0})
    async with Simulator(settings).running() as base_url, aiohttp.ClientSession() as session:
        api = Api(session, base_url)
        answers = []
        for i in range(12):
            status, _, body = await api.chat(max_tokens=20 + i)
            answers.append((status, body.get("id"), body.get("choices"), body.get("usage")))
        return answers


async def test_the_same_seed_and_requests_give_the_same_answers() -> None:
    first, second, other = await _transcript(3), await _transcript(3), await _transcript(4)

    assert first == second
    assert first != other
    assert {status for status, *_ in first} == {200, 500}  # faults drawn from the same seeded stream


# ---------------------------------------------------------------------------- rate limits


async def test_the_rpm_limit_holds_in_every_window(simulator: Simulator, api: Api) -> None:
    # Given 3 requests per 0.4 s window
    window_s, rpm = 0.4, 3
    simulator.configure({"window_s": window_s, "models": {CHAT_MODEL: {"rpm": rpm}}})

    # When clients push 5 requests at a time for a bit more than 3 windows
    answers: list[tuple[int, Any, Any]] = []
    for _ in range(12):
        answers += await asyncio.gather(*(api.chat(max_tokens=1) for _ in range(5)))
        await asyncio.sleep(0.1)

    # Then no window held more than the limit, and every refusal said when to come back
    stats = simulator.stats()[CHAT_MODEL]
    assert stats.max_in_window(window_s) == rpm
    assert stats.accepted == sum(status == 200 for status, *_ in answers) >= 3 * rpm
    refused = [headers for status, headers, _ in answers if status == 429]
    assert len(refused) == stats.by_status[429] > 0
    assert all(h["Retry-After"] == "1" for h in refused)  # whole seconds, rounded up
    assert all(h["x-ratelimit-remaining-requests"] == "0" for h in refused)
    assert all(h["x-ratelimit-limit-requests"] == str(rpm) for _, h, _ in answers)


async def test_the_tpm_limit_counts_prompt_and_completion_tokens(simulator: Simulator, api: Api) -> None:
    simulator.configure({"window_s": 30, "models": {CHAT_MODEL: {"tpm": 100}}})

    first = await api.chat(max_tokens=30)
    second = await api.chat(max_tokens=30)
    third = await api.chat(max_tokens=30)

    assert first[0] == 200
    used = first[2]["usage"]["total_tokens"]
    assert first[1]["x-ratelimit-remaining-tokens"] == str(100 - used)
    assert 429 in (second[0], third[0])
    refused = second if second[0] == 429 else third
    assert refused[2]["error"]["code"] == "rate_limit_exceeded"
    assert 0 < int(refused[1]["Retry-After"]) <= 30


# ---------------------------------------------------------------------------- control endpoints


async def test_faults_can_be_switched_on_for_one_model_at_runtime(api: Api) -> None:
    status, changed = (await api.post("/_sim/settings", {"models": {CHAT_MODEL: {"error_rate": 1.0}}}))[::2]
    assert status == 200 and changed["models"][CHAT_MODEL] == {"error_rate": 1.0}

    broken = await api.chat()
    other = await api.post("/chat/completions", {"model": "gpt-4.1", "messages": MESSAGES})

    assert broken[0] == 500 and broken[2]["error"]["type"] == "server_error"
    assert other[0] == 200
    invalid = await api.post("/_sim/settings", {"defaults": {"error_rate": 2}})
    assert invalid[0] == 400


async def test_stats_count_requests_statuses_and_tokens_until_reset(api: Api) -> None:
    await api.chat()
    await api.post("/_sim/faults", {"model": CHAT_MODEL, "fault": "unavailable", "times": 2})
    for _ in range(3):
        await api.chat()
    await api.post("/chat/completions", {"model": CHAT_MODEL})  # invalid: not counted for the model

    status, stats = await api.get("/_sim/stats")
    model = stats["models"][CHAT_MODEL]
    assert status == 200 and stats["window_s"] == 60
    assert (model["received"], model["accepted"]) == (4, 4)
    assert model["by_status"] == {"200": 2, "503": 2}
    assert model["faults"] == {"unavailable": 2}
    assert model["prompt_tokens"] > 0 and model["completion_tokens"] > 0
    assert len(model["accepted_at_s"]) == 4

    await api.post("/_sim/reset", {})
    assert (await api.get("/_sim/stats"))[1]["models"] == {}


async def test_fault_injection_is_validated(api: Api) -> None:
    assert (await api.post("/_sim/faults", {"model": CHAT_MODEL, "fault": "gremlins"}))[0] == 400
    assert (await api.post("/_sim/faults", {"model": "gpt-9", "fault": "reset"}))[0] == 404
    assert (await api.post("/_sim/faults", {"model": CHAT_MODEL, "fault": "status", "status": 200}))[0] == 400


async def test_settings_reads_mask_the_api_key(simulator: Simulator, api: Api) -> None:
    simulator.configure({"require_api_key": "sk-sim-secret"})

    status, settings = await api.get("/_sim/settings")

    assert status == 200 and "sk-sim-secret" not in orjson.dumps(settings).decode()
    assert simulator.settings.require_api_key is not None


# ---------------------------------------------------------------------------- serving


async def test_only_loopback_is_served_unless_remote_is_allowed() -> None:
    simulator = Simulator()
    with pytest.raises(ConfigError, match="non-loopback"):
        async with simulator.running(host="0.0.0.0"):
            pass

    # Allowed, it serves the API but never the control endpoints.
    async with simulator.running(host="0.0.0.0", allow_remote=True) as base_url:
        port = base_url.rsplit(":", 1)[1].removesuffix("/v1")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/v1/models") as models:
                assert models.status == 200
            async with session.get(f"http://127.0.0.1:{port}/_sim/stats") as stats:
                assert stats.status == 404


def test_settings_load_from_toml_and_report_errors(tmp_path: Path) -> None:
    good = tmp_path / "sim.toml"
    good.write_text('seed = 9\nwindow_s = 2\n[defaults]\nlatency_ms = 5\n[models."gpt-4.1"]\nrpm = 4\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[models."gpt-4.1"]\nerror_rate = 0.7\nreset_rate = 0.7\n')

    settings = SimulatorSettings.load(good, {"defaults": {"rpm": 50}})
    served = settings.served_models()
    assert settings.seed == 9 and settings.window_s == 2
    assert served["gpt-4.1"].behaviour.rpm == 4 and served[CHAT_MODEL].behaviour.rpm == 50
    assert served[CHAT_MODEL].behaviour.latency_ms == 5
    assert served[EMBEDDING_MODEL].kind == "embeddings"
    with pytest.raises(ConfigError, match="add up to more than 1"):
        SimulatorSettings.load(bad)


def test_the_command_refuses_a_remote_host() -> None:
    result = CliRunner().invoke(app, ["simulate", "--host", "0.0.0.0", "--port", "0"])

    assert result.exit_code == 2
    assert "non-loopback" in result.output


async def test_the_command_serves_until_interrupted() -> None:
    # Given `tidegate simulate` started as a user would, on a free port
    command = [sys.executable, "-c", "from tidegate.cli.main import app; app()", "simulate", "--port", "0",
               "--rpm", "7", "--seed", "1"]
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        base_url = line.split(" on ", 1)[1].strip()

        # When a client calls it
        async with aiohttp.ClientSession() as session:
            body = {"model": CHAT_MODEL, "messages": MESSAGES}
            async with session.post(base_url + "/chat/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["x-ratelimit-limit-requests"] == "7"
    finally:
        # Then Ctrl-C stops it cleanly
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    assert "Simulator stopped." in out.decode()


def test_the_simulated_provider_offers_what_the_simulator_serves() -> None:
    served = SimulatorSettings().served_models()
    config = with_simulator(TidegateConfig(queue_url="sqlite:///unused.db"), "http://127.0.0.1:1/v1")

    [provider] = config.providers
    assert {model.name: model.kind for model in provider.models} == {
        name: model.kind for name, model in served.items()}
    assert {model.kind for model in provider.models} == {"chat", "embeddings", "completion", "moderation"}

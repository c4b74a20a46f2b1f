"""The typed request contract's cost: pydantic (what the door validates with today) against
msgspec, decoding an OpenAI chat completion request once at the door and reading it back in the
worker, per request, in one run.

    .venv/bin/python -m bench.contract              # ~20 s
    .venv/bin/python -m bench.contract --rounds 3 --n 20000

Both sides do the same work, to the same rules (strict types, OpenAI's ranges, unknown fields
carried through untouched):

- **door**: the raw body (bytes) → a validated typed request → the queue's payload (bytes);
- **worker**: the payload (bytes) → the typed request again (trusted: it was validated at the
  door, but a payload is read from storage, so its types are still checked) → the provider's body
  (bytes).

pydantic runs as the gateway runs it (`orjson.loads` then `model_validate`, strict, `extra="allow"`)
and as `model_validate_json`; msgspec decodes into a `Struct` whose fields carry the same bounds
(`Meta`), and keeps what the struct does not name in a dict beside it (a Struct drops unknown
fields; this is what carrying them through costs). Two bodies: a short chat (3 messages) and a
long one (40 messages, 4 tools). The figure is CPU µs per request (process time over `--n`
requests, the best of `--rounds`), and the ratio of each to the fastest.

A second table measures what ships against what it replaced: the door as it was (pydantic, then
the body dumped) against `tidegate.contract.decode` into the job's AIRequest and its payload; the
worker as it was (the payload read as a dict, one field checked, the body sent with the routed
model) against `AIRequest.from_payload` (the payload decoded into the struct once) and the body
rendered from it (`contract.to_body`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import orjson

from tidegate.testing import AIRequest, ChatCompletionRequest, decode_request, request_body

__all__ = ["main"]

_Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
_Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]


class _Message(msgspec.Struct, omit_defaults=True):
    role: _Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _ChatRequest(msgspec.Struct, omit_defaults=True):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=128)] | None = None
    seed: _Seed | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    logit_bias: dict[str, Annotated[int, msgspec.Meta(ge=-100, le=100)]] | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    user: str | None = None
    priority: int | str | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


_CHAT_FIELDS = frozenset(_ChatRequest.__struct_fields__)
_MESSAGE_FIELDS = frozenset(_Message.__struct_fields__)


class _Typed(msgspec.Struct):
    """The typed request and what it does not name, as the queue would store it."""

    request: _ChatRequest
    extra: dict[str, Any] = {}


def _bodies() -> dict[str, bytes]:
    def message(i: int) -> dict[str, Any]:
        return {"role": ("user", "assistant")[i % 2], "content": f"Turn {i}: " + "lorem ipsum dolor " * 12}

    tool = {"type": "function", "function": {"name": "lookup", "description": "Find an order.",
                                             "parameters": {"type": "object", "properties": {
                                                 "order_id": {"type": "string"}}, "required": ["order_id"]}}}
    short = {"model": "gpt-4o-mini", "priority": "high", "temperature": 0.2, "max_tokens": 256,
             "messages": [{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": "Summarise this ticket in one line."},
                          {"role": "assistant", "content": "Sure."}],
             "metadata": {"ticket": "T-1"}}  # unknown to both: carried through
    long = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True}, "seed": 7,
            "messages": [{"role": "system", "content": "You help with orders."}]
            + [message(i) for i in range(39)],
            "tools": [tool] * 4, "tool_choice": "auto", "parallel_tool_calls": False}
    return {"short": orjson.dumps(short), "long": orjson.dumps(long)}


# -- pydantic, as the gateway validates today ----------------------------------------------------

def _pydantic_door(raw: bytes) -> bytes:
    request = ChatCompletionRequest.model_validate(orjson.loads(raw))
    return orjson.dumps({"kind": "chat", "body": request.model_dump(exclude_unset=True)})


def _pydantic_door_json(raw: bytes) -> bytes:
    request = ChatCompletionRequest.model_validate_json(raw)
    return request.model_dump_json(exclude_unset=True).encode()


def _pydantic_worker(payload: bytes) -> bytes:
    body = orjson.loads(payload)["body"]
    request = ChatCompletionRequest.model_validate(body)
    return orjson.dumps(request.model_dump(exclude_unset=True, exclude={"priority"}))


# -- msgspec -------------------------------------------------------------------------------------

_decode_typed = msgspec.json.Decoder(_Typed).decode
_encode = msgspec.json.Encoder().encode


def _msgspec_door(raw: bytes) -> bytes:
    document = orjson.loads(raw)
    request = msgspec.convert(document, _ChatRequest, strict=True)
    extra = {key: value for key, value in document.items() if key not in _CHAT_FIELDS}
    return _encode(_Typed(request, extra))


def _msgspec_worker(payload: bytes) -> bytes:
    typed = _decode_typed(payload)
    body = msgspec.to_builtins(typed.request)
    body.pop("priority", None)
    body.update(typed.extra)
    return orjson.dumps(body)


# -- what ships, against what it replaced ----------------------------------------------------------

def _door_before(raw: bytes) -> bytes:
    body = ChatCompletionRequest.model_validate(orjson.loads(raw)).model_dump(exclude_unset=True)
    body.pop("priority", None)
    return orjson.dumps({"kind": "chat", "body": body})


def _worker_before(payload: bytes) -> bytes:
    body = orjson.loads(payload)["body"]
    if not isinstance(body.get("messages"), list):  # the one check the worker made
        raise ValueError("no messages")
    return orjson.dumps({**body, "model": "gpt-4.1"})


def _door_shipped(raw: bytes) -> bytes:
    # As the intake does: the priority is tidegate's, not the provider's.
    body = msgspec.structs.replace(decode_request("chat", orjson.loads(raw)), priority=None)
    return orjson.dumps(AIRequest("chat", body).to_payload())


def _worker_shipped(payload: bytes) -> bytes:
    request = AIRequest.from_payload(orjson.loads(payload))
    return orjson.dumps({**request_body(request.body), "model": "gpt-4.1"})


def _cpu_us(step: Callable[[bytes], bytes], raw: bytes, n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(n):
            step(raw)
        best = min(best, time.process_time() - started)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5_000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bodies = _bodies()
    for raw in bodies.values():  # both sides accept both bodies and agree on what reaches the provider
        sent_by_pydantic = orjson.loads(_pydantic_worker(_pydantic_door(raw)))
        assert sent_by_pydantic == orjson.loads(_msgspec_worker(_msgspec_door(raw)))
        # what ships sends the provider what the code it replaced sent
        sent_before = orjson.loads(_worker_before(_door_before(raw)))
        assert sent_before == orjson.loads(_worker_shipped(_door_shipped(raw)))
    print("| body | step | pydantic (orjson + model_validate) | pydantic (model_validate_json) "
          "| msgspec | msgspec / pydantic |")
    print("|---|---|---:|---:|---:|---:|")
    for name, raw in bodies.items():
        door = {label: _cpu_us(step, raw, args.n, args.rounds) for label, step in (
            ("pydantic", _pydantic_door), ("pydantic_json", _pydantic_door_json), ("msgspec", _msgspec_door))}
        worker = {"pydantic": _cpu_us(_pydantic_worker, _pydantic_door(raw), args.n, args.rounds),
                  "msgspec": _cpu_us(_msgspec_worker, _msgspec_door(raw), args.n, args.rounds)}
        print(f"| {name} ({len(raw):,} B) | door | {door['pydantic']:.1f} us "
              f"| {door['pydantic_json']:.1f} us "
              f"| {door['msgspec']:.1f} us | {door['msgspec'] / door['pydantic']:.2f}x |")
        print(f"| {name} | worker | {worker['pydantic']:.1f} us | - | {worker['msgspec']:.1f} us "
              f"| {worker['msgspec'] / worker['pydantic']:.2f}x |")
    print("\n| body | step | before (pydantic door, dict worker) | tidegate.contract | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, raw in bodies.items():
        before = {"door": _cpu_us(_door_before, raw, args.n, args.rounds),
                  "worker": _cpu_us(_worker_before, _door_before(raw), args.n, args.rounds)}
        shipped = {"door": _cpu_us(_door_shipped, raw, args.n, args.rounds),
                   "worker": _cpu_us(_worker_shipped, _door_shipped(raw), args.n, args.rounds)}
        for step in ("door", "worker"):
            print(f"| {name} | {step} | {before[step]:.1f} us | {shipped[step]:.1f} us "
                  f"| {shipped[step] / before[step]:.2f}x |")
        total_before, total_shipped = sum(before.values()), sum(shipped.values())
        print(f"| {name} | both | {total_before:.1f} us | {total_shipped:.1f} us "
              f"| {total_shipped / total_before:.2f}x |")

if __name__ == "__main__":
    main()

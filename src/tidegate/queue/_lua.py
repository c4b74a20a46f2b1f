"""The Redis queue's Lua scripts as they are sent: each with exactly the keys it touches.

Every script in lua/ names its keys on its `-- KEYS:` line (running to the `-- ARGV` line):
plain names (`jobs`, `dead`) and per-level families (`ready:0..4`, five keys, levels 0 to 4).
That line is the one place a script's keys are written down: `QueueScript` reads it when the
queue opens and builds both the KEYS list a call sends (built once, reused by every call) and the
Lua table `K` the script reads them from, placed after lua/_common.lua so that the shared helpers
can only reach keys passed to them. The queue's settings (tenant round-robin, aging interval,
depth limits, the job-done channel) become constants ahead of the helpers, so no call carries
them in ARGV; a queue with other settings loads scripts of its own. So does the command that
announces finished jobs (`publish`: SPUBLISH on a Redis Cluster, see `RedisClient.listen`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidegate._redis import lua_source
from tidegate.queue.settings import QueueSettings

LEVELS = range(5)
_PACKAGE = "tidegate.queue"
_COMMON = "_common"
_NAME = re.compile(r"[a-z]+(:0\.\.4)?")


@dataclass(frozen=True)
class QueueScript:
    """One script ready to register: its full source and the KEYS every call of it sends."""

    source: str
    keys: tuple[str, ...]


def key_names(source: str) -> list[str]:
    """The names on a script's `-- KEYS:` line and its continuation lines, up to `-- ARGV`."""
    lines = source.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith("-- KEYS:")), None)
    end = next((n for n, line in enumerate(lines) if line.startswith("-- ARGV")), None)
    if start is None or end is None or end < start:
        raise ValueError("a queue script needs a `-- KEYS:` line followed by an `-- ARGV` line")
    text = " ".join(line.removeprefix("--") for line in lines[start:end]).removeprefix(" KEYS:")
    names = text.split()
    for name in names:
        if not _NAME.fullmatch(name):
            raise ValueError(f"queue script key {name!r}: a name or a family `name:0..4`")
    return names


def queue_script(name: str, prefix: str, settings: QueueSettings, done_channel: str, *,
                 publish: str = "PUBLISH") -> QueueScript:
    """`lua/<name>.lua` after the settings and lua/_common.lua, with the keys it names under
    `prefix` (the queue's `tidegate:{name}:`); finished jobs announced with `publish`."""
    return compose(lua_source(_PACKAGE, name), prefix, settings, done_channel, publish=publish)


def compose(own: str, prefix: str, settings: QueueSettings, done_channel: str, *,
            publish: str = "PUBLISH") -> QueueScript:
    """A script's own text `own` as it is sent: the settings, lua/_common.lua, then the table `K`
    of the keys on its KEYS line, then `own`."""
    keys: list[str] = []
    fields: list[str] = []
    for key in key_names(own):
        family = key.removesuffix(":0..4")
        if family == key:
            keys.append(prefix + key)
            fields.append(f"{key} = KEYS[{len(keys)}]")
            continue
        levels = []
        for level in LEVELS:
            keys.append(f"{prefix}{family}:{level}")
            levels.append(f"[{level}] = KEYS[{len(keys)}]")
        fields.append(f"{family} = strict({{{', '.join(levels)}}}, '{family} level')")
    table = f"local K = strict({{{', '.join(fields)}}}, 'key')\n"
    head = _settings_lua(settings, done_channel, publish) + lua_source(_PACKAGE, _COMMON) + "\n"
    source = head + table + own
    return QueueScript(source=source, keys=tuple(keys))


def _settings_lua(settings: QueueSettings, done_channel: str, publish: str) -> str:
    if publish not in ("PUBLISH", "SPUBLISH"):
        raise ValueError(f"finished jobs are announced with PUBLISH or SPUBLISH, not {publish!r}")
    depths = ", ".join(f"[{level}] = {settings.max_depth.get(level, -1)}" for level in LEVELS)
    return (
        f"local ROUND_ROBIN = {'true' if settings.tenant_round_robin else 'false'}\n"
        f"local AGING_MS = {int((settings.aging_interval_s or 0) * 1000)}\n"
        f"local DONE_CHANNEL = {_lua_string(done_channel)}\n"
        f"local DONE_PUBLISH = '{publish}'\n"
        f"local MAX_DEPTH = {{{depths}}}\n"
    )


def _lua_string(text: str) -> str:
    """A Lua string literal of `text`: every byte outside a safe set as a decimal escape."""
    safe = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:{}_-.")
    return "'" + "".join(chr(b) if b in safe else f"\\{b}" for b in text.encode()) + "'"

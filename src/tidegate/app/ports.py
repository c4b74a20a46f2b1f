"""Binding the port a process serves on, and when it is taken, saying who likely holds it.

A busy port is the commonest reason a second `tidegate up` or `tidegate gateway` cannot start.
It is bound first, before anything is opened or changed, so that such a start fails at once
with one line (a ConfigError: exit 2 from the command line) that names the port and, when the
kernel shows it, the process listening there — its pid and command line, as `ss -ltnp` shows
them. That lookup reads /proc (the listening sockets of /proc/net/tcp and tcp6, then the open
descriptors of each process): psutil would do the same, and is not a dependency for this one
use. A process whose descriptors this user may not read is not named; elsewhere than Linux
nothing is.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

from tidegate.errors import ConfigError

__all__ = ["bind_port", "port_owner"]

# Until uvicorn's server takes the socket over and sets its own backlog (asyncio listens again).
_BACKLOG = 128
_LISTEN = "0A"  # the TCP state LISTEN as /proc/net/tcp writes it
_PROC = Path("/proc")
_LOOKUP_BUDGET_S = 1.0  # a machine with very many processes gets no name rather than a slow error
_MAX_COMMAND_CHARS = 120


def bind_port(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: any free one) and listening. With `reuse_port`
    other processes that ask for it too may bind the same port (SO_REUSEPORT), and it does not
    listen yet: the kernel would hand it connections of the shared port before its server is
    ready to accept them. A port that cannot be bound is a ConfigError saying why in one line,
    naming the likely owner of a busy port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
        if not reuse_port:
            # Listening now, not when the server starts: two sockets with SO_REUSEADDR may both
            # be bound to a port, and only the second listen() would fail, long after the bind.
            sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise _cannot_listen(host, port, exc) from None
    return sock


def _cannot_listen(host: str, port: int, exc: OSError) -> ConfigError:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        owner = port_owner(port)
        by = f" by {owner}" if owner else ""
        return ConfigError(f"cannot listen on {where}: port {port} is already in use{by}; stop that "
                           "process, or choose another port with --port (0: any free one)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"cannot listen on {where}: {host} is not an address of this machine")
    if exc.errno == errno.EACCES:
        return ConfigError(f"cannot listen on {where}: permission denied (ports below 1024 need privileges)")
    return ConfigError(f"cannot listen on {where}: {exc.strerror or exc}")


def port_owner(port: int) -> str | None:
    """"pid N (command line)" of a process listening on TCP `port`, when /proc shows one this
    user may look at; else None."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    deadline = time.monotonic() + _LOOKUP_BUDGET_S
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        if time.monotonic() > deadline:
            return None
        if _holds_any(entry, wanted):
            return f"pid {entry.name} ({_command(entry)})"
    return None


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on `port`, IPv4 and IPv6."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            _, _, local_port = fields[1].rpartition(":")
            if int(local_port, 16) == port and fields[9] != "0":
                inodes.add(fields[9])
    return inodes


def _holds_any(process: Path, targets: set[str]) -> bool:
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:  # another user's process, or one that just ended
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor) in targets:
                return True
        except OSError:
            continue
    return False


def _command(process: Path) -> str:
    try:
        raw = (process / "cmdline").read_bytes()
    except OSError:
        return "command unknown"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(command) > _MAX_COMMAND_CHARS:
        command = command[: _MAX_COMMAND_CHARS - 1] + "…"
    return command or "command unknown"

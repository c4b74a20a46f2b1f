"""A private PostgreSQL cluster for the tests and the change-flow benchmark: initdb in a temporary
folder, `wal_level=logical`, a free loopback port and a unix socket in the same folder, trust
authentication, no fsync.

PostgreSQL refuses to run as root, and CI runs as root: there the cluster belongs to an
unprivileged account (`postgres` when the packages created it, else `nobody`) and every server
command runs through `runuser`. As a normal user the cluster simply belongs to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POSTGRES_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "postgres"
START_TIMEOUT_S = 30
PORT_ATTEMPTS = 3
# Accounts tried, in order, for owning the cluster when the tests run as root.
SERVICE_ACCOUNTS = ("postgres", "nobody")

SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_connections": "120",
    # Test data is thrown away: durability costs time and buys nothing here.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


class PostgresUnavailable(RuntimeError):
    """The binaries are missing or the cluster would not start; the message says how to fix it."""


def find_bin_dir(root: Path = POSTGRES_ROOT) -> Path:
    """The newest `/usr/lib/postgresql/<version>/bin` that holds initdb and pg_ctl."""
    candidates = []
    for entry in root.glob("*/bin") if root.is_dir() else ():
        version = entry.parent.name
        if (entry / "initdb").is_file() and (entry / "pg_ctl").is_file():
            number = tuple(int(part) for part in re.findall(r"\d+", version)) or (0,)
            candidates.append((number, entry))
    if not candidates:
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries under {root}/*/bin: run `make servers` "
            "(it installs Debian's postgresql package) or `apt-get install postgresql`"
        )
    return max(candidates)[1]


def _free_port() -> int:
    # Another process may take the port before the server binds it; start() retries then.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _service_account() -> pwd.struct_passwd | None:
    """None when not root (the cluster is ours); else the account that will own it."""
    if os.geteuid() != 0:
        return None
    for name in SERVICE_ACCOUNTS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable(
        "running as root and neither a 'postgres' nor a 'nobody' account exists to own the test "
        "cluster (PostgreSQL refuses to run as root): create one with `useradd postgres`"
    )


@dataclass
class PostgresServer:
    """One running cluster. `dsn(dbname)` gives a libpq keyword DSN over loopback TCP."""

    bin_dir: Path
    workdir: Path
    port: int = 0
    account: pwd.struct_passwd | None = None
    _databases: list[str] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        """The cluster's data directory."""
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        """The server log (pg_ctl -l)."""
        return self.workdir / "server.log"

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A keyword DSN for `dbname` as the superuser; extra libpq parameters are appended."""
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": SUPERUSER, "dbname": dbname,
                 **params}
        return " ".join(f"{key}={_quote(value)}" for key, value in parts.items())

    # ------------------------------------------------------------------ lifecycle

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.account is not None:
            command = ["runuser", "-u", self.account.pw_name, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=self.workdir,
                              env={**os.environ, "LC_ALL": "C", "LANG": "C"})

    def init(self) -> None:
        """initdb the data directory (owned by the service account when running as root)."""
        self.account = _service_account()
        if self.account is not None:
            os.chown(self.workdir, self.account.pw_uid, self.account.pw_gid)
        try:
            self._run(str(self.bin_dir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER,
                      "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        except subprocess.CalledProcessError as exc:
            raise PostgresUnavailable(f"initdb failed:\n{exc.stdout}\n{exc.stderr}") from exc

    def start(self) -> None:
        """Start on a free port, retrying with another port when the chosen one is taken."""
        failures = []
        for _ in range(PORT_ATTEMPTS):
            self.port = _free_port()
            settings = {**SERVER_SETTINGS, "port": str(self.port),
                        "unix_socket_directories": f"'{self.workdir}'"}
            with (self.datadir / "postgresql.auto.conf").open("w") as conf:
                conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
            result = self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.datadir), "-l",
                               str(self.log_path), "-w", "-t", str(START_TIMEOUT_S), "start",
                               check=False)
            if result.returncode == 0:
                return
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            failures.append(f"pg_ctl start (port {self.port}) exited {result.returncode}:\n"
                            f"{result.stdout}{result.stderr}\n--- {self.log_path} ---\n{log}")
        raise PostgresUnavailable("could not start PostgreSQL:\n" + "\n".join(failures))

    def stop(self) -> None:
        """Stop the server (immediate: its data is thrown away) and remove the folder."""
        try:
            if (self.datadir / "postmaster.pid").exists():
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.datadir), "-m",
                          "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ databases

    def connect(self, dbname: str = "postgres") -> Any:
        """An autocommit psycopg2 connection to `dbname`."""
        # Imported here, so the server part runs under any Python.
        import psycopg2  # type: ignore[import-untyped]

        conn = psycopg2.connect(self.dsn(dbname))
        conn.autocommit = True
        return conn

    def create_database(self) -> str:
        """A new empty database with a unique name."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return name

    def drop_database(self, name: str) -> None:
        """Drop `name` with its replication slots (a database with logical slots cannot be
        dropped), ending whatever still uses it."""
        import psycopg2

        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE database = %s AND active_pid IS NOT NULL", (name,))
            deadline = time.monotonic() + 10
            while True:
                cur.execute("SELECT slot_name FROM pg_replication_slots "
                            "WHERE database = %s AND NOT active", (name,))
                for (slot,) in cur.fetchall():
                    with contextlib.suppress(psycopg2.Error):
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,))
                row = cur.fetchone()
                if (row is not None and row[0] == 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._databases:
            self._databases.remove(name)


def _quote(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """A started cluster in a fresh temporary folder, stopped and removed on exit."""
    bin_dir = find_bin_dir()
    # Not under pytest's basetemp: that folder is private to the user running the tests, and as
    # root the cluster's owner must be able to reach its own directory.
    workdir = Path(tempfile.mkdtemp(prefix="tidegate-pg-"))
    server = PostgresServer(bin_dir, workdir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()

"""Warm rank groups: several jobs' ranks start once, then each waits for its turn on a command.

The speedup study interleaves its cells (study.run): every cell's ranks start together, and a
coordinator (the calling process) sends them commands one group at a time. Each rank connects to
the coordinator's TCP server on 127.0.0.1 (port and token in its spec under `channel`), says
hello, and then blocks in a read of its own connection: no busy poll, and no collective while
it waits, so no gloo timeout can end a rank that waits for its turn however long the others
take. A command is one JSON line sent to every rank of a group; every rank answers with one
JSON line; the coordinator uses global rank 0's answer. After "done" the ranks return to
`launch.local.serve_rank`, rank 0 writes its result to the out file, and the group exits.

    with Coordinator.open() as coord:
        coord.start("ddp-w2", ["cell-worker", "warm"], spec, folder, nproc=2, threads_per_process=1)
        coord.wait_connected()
        figures = coord.command("ddp-w2", {"do": "repeat"})
        result = coord.finish("ddp-w2")
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.launch.local import rank_stderr, worker_command, worker_env
from scalelab.runtime.io import atomic_write_json

POLL_S = 1.0  # how often a wait for a rank checks that its processes are still alive
EXIT_S = 120.0  # how long a group may take to leave its process group and exit after "done"


class GroupFailed(RuntimeError):
    """A group's processes exited, or a rank broke the protocol; the message says why."""


@dataclass
class Group:
    name: str
    nproc: int  # ranks that connect
    proc: subprocess.Popen
    log: Path  # one process: its stderr; torchrun: the agent's, beside its ranks' logs
    out: Path
    conns: dict[int, socket.socket] = field(default_factory=dict)  # rank -> connection
    buffers: dict[int, bytearray] = field(default_factory=dict)


class Coordinator:
    """The calling side: starts groups, sends commands, collects answers and results."""

    def __init__(self, server: socket.socket, token: str, logs: tempfile.TemporaryDirectory) -> None:
        self.server, self.token, self.logs, self.groups = server, token, logs, {}

    @classmethod
    def open(cls) -> Coordinator:
        """A server on a free port of 127.0.0.1, a fresh token, and a private folder for the logs."""
        logs = tempfile.TemporaryDirectory(prefix="scalelab-warm-")
        return cls(socket.create_server(("127.0.0.1", 0)), secrets.token_hex(16), logs)

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(
        self,
        name: str,
        args: list[str],
        spec: dict[str, Any],
        folder: Path,
        *,
        nproc: int | None,
        threads_per_process: int,
    ) -> None:
        """Starts `scalelab ARGS --spec SPEC --out OUT` (under torchrun with `nproc` ranks when
        given), its spec carrying this coordinator's channel."""
        port = self.server.getsockname()[1]
        channel = {"host": "127.0.0.1", "port": port, "token": self.token, "group": name}
        spec_path, out = folder / f"{name}.spec.json", folder / f"{name}.out.json"
        atomic_write_json(spec_path, {**spec, "channel": channel})
        out.unlink(missing_ok=True)
        logs = Path(self.logs.name) / name
        logs.mkdir()
        cmd = worker_command([*args, "--spec", str(spec_path), "--out", str(out)], nproc, logs, tee=False)
        with open(logs / "launcher.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, env=worker_env(threads_per_process), stdout=log, stderr=log, start_new_session=True
            )
        self.groups[name] = Group(name, nproc or 1, proc, logs / "launcher.log", out)

    def wait_connected(self) -> dict[str, str]:
        """Accepts every rank's hello; returns {group: why it failed} for groups that died first."""
        failed: dict[str, str] = {}
        while True:
            waiting = [g for g in self.groups.values() if len(g.conns) < g.nproc and g.name not in failed]
            for group in waiting:
                if group.proc.poll() is not None:
                    failed[group.name] = self._why(group)
                    self.stop(group.name)
            if not [g for g in waiting if g.name not in failed]:
                return failed
            ready, _, _ = select.select([self.server], [], [], POLL_S)
            if ready:
                self._hello(*self.server.accept())

    def _hello(self, conn: socket.socket, _addr: Any) -> None:
        conn.settimeout(30.0)  # a hello is one short line, sent on connecting
        try:
            hello = json.loads(_read_line(conn, bytearray()))
        except (OSError, ValueError):
            conn.close()
            return
        group = self.groups.get(hello.get("group")) if isinstance(hello, dict) else None
        if group is None or not secrets.compare_digest(str(hello.get("token")), self.token):
            conn.close()  # not one of ours
            return
        conn.settimeout(None)
        group.conns[int(hello["rank"])] = conn
        group.buffers[int(hello["rank"])] = bytearray()

    def command(self, name: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """Sends `cmd` to every rank of group `name`; returns global rank 0's answer.

        Raises:
            GroupFailed: the group's processes exited or a rank closed its connection; the
                group is stopped and the message holds its last stderr lines.
        """
        group = self.groups[name]
        line = (json.dumps(cmd) + "\n").encode()
        try:
            for conn in group.conns.values():
                conn.sendall(line)
            answers = {rank: self._answer(group, rank) for rank in sorted(group.conns)}
        except (OSError, ValueError, GroupFailed) as exc:
            why = self._why(group) if group.proc.poll() is not None else str(exc)
            self.stop(name)
            raise GroupFailed(why) from None
        return answers[0]

    def _answer(self, group: Group, rank: int) -> dict[str, Any]:
        conn, buffer = group.conns[rank], group.buffers[rank]
        while b"\n" not in buffer:  # a blocking wait on the socket, waking to check the processes
            ready, _, _ = select.select([conn], [], [], POLL_S)
            if not ready:
                if group.proc.poll() is not None:
                    raise GroupFailed(self._why(group))
                continue
            chunk = conn.recv(65536)
            if not chunk:
                raise GroupFailed(f"rank {rank} closed its connection")
            buffer += chunk
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return json.loads(line)

    def finish(self, name: str) -> dict[str, Any]:
        """Sends "done", waits for the group to exit and returns what rank 0 wrote to its out file."""
        self.command(name, {"do": "done"})
        group = self.groups[name]
        try:
            code = group.proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            self.stop(name)
            raise GroupFailed(f"still running {EXIT_S:.0f} s after done (stopped): {self._why(group)}") from None
        self.groups.pop(name)
        for conn in group.conns.values():
            conn.close()
        if code != 0 or not group.out.is_file():
            raise GroupFailed(self._why(group))
        return json.loads(group.out.read_text())

    def _why(self, group: Group) -> str:
        """'exit CODE: ' and the last three stderr lines of the first rank that wrote any."""
        code = group.proc.poll()
        folder = group.log.parent
        tails = [rank_stderr(folder, r)[-3:] for r in range(group.nproc)] if group.nproc > 1 else []
        tail = next((t for t in tails if t), None) or _tail(group.log)
        return f"exit {code}: {' | '.join(tail)}"[:500]

    def stop(self, name: str) -> None:
        """Ends group `name`'s processes (their whole session) and forgets it."""
        group = self.groups.pop(name, None)
        if group is None:
            return
        for conn in group.conns.values():
            conn.close()
        if group.proc.poll() is None:
            try:
                os.killpg(group.proc.pid, signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
                group.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(group.proc.pid, signal.SIGKILL)
                group.proc.wait()

    def close(self) -> None:
        for name in list(self.groups):
            self.stop(name)
        self.server.close()
        self.logs.cleanup()


def _tail(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln.strip() for ln in lines if ln.strip()][-3:]


def _read_line(conn: socket.socket, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


class Channel:
    """A rank's side: its connection to the coordinator. Iterating yields commands (blocking
    reads); `answer` replies to the current one."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, bytearray()

    @classmethod
    def connect(cls, channel: dict[str, Any], rank: int) -> Channel:
        conn = socket.create_connection((channel["host"], channel["port"]), timeout=60.0)
        conn.settimeout(None)  # from here on a rank waits for its turn as long as it takes
        hello = {"token": channel["token"], "group": channel["group"], "rank": rank}
        conn.sendall((json.dumps(hello) + "\n").encode())
        return cls(conn)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            try:
                line = _read_line(self.conn, self.buffer)
            except OSError:  # the coordinator is gone: nothing more to do
                return
            yield json.loads(line)

    def answer(self, reply: dict[str, Any]) -> None:
        self.conn.sendall((json.dumps(reply) + "\n").encode())

    def close(self) -> None:
        self.conn.close()

"""Warm rank groups (launch.warm): the command channel between the coordinator and each rank."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from scalelab.launch import warm


def test_a_group_that_dies_before_it_connects_is_reported_with_its_stderr(tmp_path):
    with warm.Coordinator.open() as coord:
        coord.start("broken", ["no-such-command"], {}, tmp_path, nproc=None, threads_per_process=1)
        failed = coord.wait_connected()
    assert failed["broken"].startswith("exit 2: ") and "no-such-command" in failed["broken"], failed


def rank(channel: dict, number: int, seen: list) -> None:
    """A stand-in rank: answers each command with its name and number until "done"."""
    chan = warm.Channel.connect(channel, number)
    for cmd in chan:
        seen.append((number, cmd["do"]))
        chan.answer({"rank": number, "did": cmd["do"]})
        if cmd["do"] == "done":
            break
    chan.close()


def test_every_rank_gets_each_command_and_rank_0_answers_and_a_stranger_is_refused(tmp_path):
    with warm.Coordinator.open() as coord:
        port = coord.server.getsockname()[1]
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        coord.groups["g"] = warm.Group("g", 2, sleeper, tmp_path / "log", tmp_path / "out.json")
        channel = {"host": "127.0.0.1", "port": port, "token": coord.token, "group": "g"}
        seen: list = []
        stranger = socket.create_connection(("127.0.0.1", port))  # first in line, with a wrong token
        stranger.sendall(b'{"token": "wrong", "group": "g", "rank": 0}\n')
        ranks = [threading.Thread(target=rank, args=(channel, n, seen)) for n in (1, 0)]
        for thread in ranks:
            thread.start()
        assert coord.wait_connected() == {} and sorted(coord.groups["g"].conns) == [0, 1]
        assert stranger.recv(1) == b""  # refused: its connection was closed, it gets no command
        assert coord.command("g", {"do": "repeat"}) == {"rank": 0, "did": "repeat"}
        coord.command("g", {"do": "done"})
        for thread in ranks:
            thread.join(timeout=30)
        assert sorted(seen) == [(0, "done"), (0, "repeat"), (1, "done"), (1, "repeat")]
        coord.stop("g")
    assert sleeper.poll() is not None


def test_a_group_whose_process_exits_mid_command_fails_with_its_exit_code(tmp_path):
    with warm.Coordinator.open() as coord:
        port = coord.server.getsockname()[1]
        short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"], start_new_session=True)
        coord.groups["g"] = warm.Group("g", 1, short, tmp_path / "log", tmp_path / "out.json")
        channel = {"host": "127.0.0.1", "port": port, "token": coord.token, "group": "g"}
        mute = warm.Channel.connect(channel, 0)  # connected, and never answers
        coord.wait_connected()
        with pytest.raises(warm.GroupFailed, match="exit 0"):
            coord.command("g", {"do": "repeat"})
        assert "g" not in coord.groups
        mute.close()

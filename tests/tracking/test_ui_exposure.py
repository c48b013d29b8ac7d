"""`scalelab ui` has no login: it refuses a non-loopback bind unless ALLOW_NO_AUTH=1 (the server
script's rule), in one line and before anything starts."""

import pytest

from scalelab.cli import main
from scalelab.cli.ui import is_loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "login1"])
def test_a_non_loopback_host_is_refused(workdir, host, capsys, monkeypatch):
    monkeypatch.delenv("ALLOW_NO_AUTH", raising=False)
    (workdir / "params.yaml").write_text("tracking: {experiment: x}\n")
    assert main(["ui", "--params", "params.yaml", "--host", host, "--print-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--host {host}" in err[0] and "ALLOW_NO_AUTH=1" in err[0], err


def test_loopback_names():
    assert all(map(is_loopback, ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.0.1", "example.org"]))


def test_allow_no_auth_lets_it_bind_anywhere(workdir, capsys, monkeypatch):
    monkeypatch.setenv("ALLOW_NO_AUTH", "1")
    (workdir / "params.yaml").write_text("tracking: {experiment: x}\n")
    assert main(["ui", "--params", "params.yaml", "--host", "0.0.0.0", "--print-only"]) == 0
    assert "http://0.0.0.0:5000/#/experiments/" in capsys.readouterr().out

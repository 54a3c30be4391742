"""The base class's shared behaviour, on a machine that runs commands in a local shell.

These tests need no guest: ``LocalShell`` implements the primitives with ``sh -c`` on the
host, so quoting, observation and ``write_file`` are exercised through the real shell.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmtests.driver.errors import CommandFailed, WaitTimeout
from vmtests.driver.machine import (
    MAX_RETRY_INTERVAL,
    RETRY_INTERVAL,
    CommandResult,
    Machine,
    render_command,
)
from vmtests.driver.transfer import CHUNK_BYTES


class LocalShell(Machine):
    """Commands run in a local ``sh -c``; nothing to start or stop."""

    def __init__(self) -> None:
        self.name = "local"
        self.sent: list[str] = []

    def _start(self) -> None:
        pass

    def _shutdown(self, timeout: float) -> None:
        pass

    def _crash(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def _run(self, command: str, timeout: float) -> CommandResult:
        self.sent.append(command)
        start = time.monotonic()
        done = subprocess.run(
            ["sh", "-c", command], check=False, capture_output=True, timeout=timeout
        )
        return CommandResult(
            command, done.returncode, done.stdout, done.stderr, time.monotonic() - start
        )

    def _issue_reboot(self) -> None:
        raise NotImplementedError

    def _wait_until_answering(self, deadline: float) -> None:
        raise NotImplementedError


HOSTILE = ["it's", "a b", "$(touch /tmp/vmtests-pwned)", "x;y", "*", "new\nline", ""]


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_arguments_reach_the_command_as_one_word_each(value: str) -> None:
    machine = LocalShell()
    out = machine.succeed("printf '<%%s>' %s %s", value, "second")
    assert out == f"<{value}><second>"


def test_a_list_argument_becomes_several_quoted_words() -> None:
    machine = LocalShell()
    assert machine.succeed("printf '[%%s]' %s", ["a b", "c'd"]) == "[a b][c'd]"


def test_without_arguments_the_command_is_sent_as_written() -> None:
    assert render_command("date +%s | tr -d '%'", ()) == "date +%s | tr -d '%'"


def test_a_positional_timeout_is_refused_loudly() -> None:
    """``succeed(cmd, 30)`` (the old signature) must not silently become an argument."""
    with pytest.raises(TypeError):
        LocalShell().succeed("true", 30)


def test_observers_see_each_outermost_call_once(tmp_path: Path) -> None:
    machine = LocalShell()
    seen: list[tuple[str, CommandResult | None]] = []
    stop = machine.observe(lambda name, seconds, result: seen.append((name, result)))
    machine.succeed("true")
    machine.write_file(str(tmp_path / "f"), "x")
    machine.start()
    stop()
    machine.succeed("true")
    names = [name for name, _ in seen]
    # write_file runs a command inside: reported as write_files only, not also as execute.
    assert names == ["execute", "write_files", "start"]
    assert seen[0][1] is not None
    assert seen[0][1].rc == 0


def test_write_file_is_exact_and_creates_the_directory(tmp_path: Path) -> None:
    machine = LocalShell()
    target = tmp_path / "new" / "dir" / "unit.service"
    text = "[Service]\nExecStart=/bin/echo 'a b' \"$HOME\" %s %%\n\u00e9\n"
    machine.write_file(str(target), text)
    assert target.read_text() == text
    assert not (tmp_path / "new" / "dir" / "unit.service.tmp").exists()


class _Health(http.server.BaseHTTPRequestHandler):
    """``/health``: 503 for the first ``ready_after`` requests, then 200."""

    ready_after = 2
    seen = 0

    def do_GET(self) -> None:
        type(self).seen += 1
        self.send_response(200 if type(self).seen > type(self).ready_after else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class ForwardedShell(LocalShell):
    """A local shell whose port 8000 the host reaches at ``address``, like a forwarded port."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__()
        self.address = address

    def host_address(self, port: int) -> tuple[str, int] | None:
        return self.address if port == 8000 else None


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    _Health.seen = 0
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_http_readiness_is_asked_from_the_host_through_the_forward(
    health_server: http.server.HTTPServer,
) -> None:
    machine = ForwardedShell(("127.0.0.1", health_server.server_address[1]))
    machine.wait_for_http_ok(8000, "/health", timeout=30)
    assert _Health.seen == 3  # two 503s, then the 200
    assert machine.sent == []  # no command on the machine


def test_http_readiness_timeout_names_the_url_and_the_last_answer(
    health_server: http.server.HTTPServer,
) -> None:
    _Health.ready_after = 10**6
    machine = ForwardedShell(("127.0.0.1", health_server.server_address[1]))
    try:
        with pytest.raises(WaitTimeout) as caught:
            machine.wait_for_http_ok(8000, "/health", timeout=1.5)
    finally:
        _Health.ready_after = 2
    message = str(caught.value)
    assert "http://127.0.0.1:8000/health on local to answer 200" in message
    assert "last answer: 503 Service Unavailable" in message


def test_http_readiness_without_a_forward_runs_curl_on_the_machine() -> None:
    machine = LocalShell()
    with pytest.raises(WaitTimeout) as caught:
        machine.wait_for_http_ok(1, "/health", timeout=1.5)
    assert machine.sent
    assert all("curl -sf -m 5" in command for command in machine.sent)
    assert "http://127.0.0.1:1/health" in str(caught.value)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses of the driver's polls, recorded instead of slept (other callers of
    ``time.sleep``, such as ``subprocess``, still sleep)."""
    recorded: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == "vmtests.driver.machine":
            recorded.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return recorded


def test_a_poll_on_the_machine_backs_off_to_the_cap(tmp_path: Path, sleeps: list[float]) -> None:
    counter = tmp_path / "tries"
    counter.write_text("0")
    machine = LocalShell()
    machine.wait_until_succeeds(
        f'n=$(($(cat {counter}) + 1)); echo $n > {counter}; [ "$n" -ge 8 ]', timeout=300
    )
    assert counter.read_text().strip() == "8"
    assert sleeps == [0.5, 0.75, 1.125, 1.6875, 2.0, 2.0, 2.0]
    assert MAX_RETRY_INTERVAL == 2.0


def test_a_poll_from_the_host_keeps_its_interval(
    health_server: http.server.HTTPServer, sleeps: list[float]
) -> None:
    machine = ForwardedShell(("127.0.0.1", health_server.server_address[1]))
    machine.wait_for_http_ok(8000, "/health", timeout=30)
    assert sleeps == [RETRY_INTERVAL, RETRY_INTERVAL]  # two 503s, then the 200


@pytest.fixture
def staging_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the local shell's ``mktemp -d`` makes the copy's staging directory."""
    root = tmp_path / "staging"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    return root


def test_a_copy_that_fits_one_chunk_is_one_command(tmp_path: Path, staging_root: Path) -> None:
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("a\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    machine = LocalShell()
    machine.copy_to(source, str(tmp_path / "copied"))
    assert len(machine.sent) == 1
    assert (tmp_path / "copied" / "sub" / "a.txt").read_text() == "a\n"
    assert os.access(tmp_path / "copied" / "run.sh", os.X_OK)
    assert not list(staging_root.iterdir())  # the staging directory is gone


def test_a_copy_makes_one_command_per_chunk_and_leaves_nothing(
    tmp_path: Path, staging_root: Path
) -> None:
    payload = os.urandom(3 * CHUNK_BYTES + 100)  # random: gzip cannot shrink it
    (tmp_path / "blob.bin").write_bytes(payload)
    machine = LocalShell()
    machine.copy_to(tmp_path / "blob.bin", str(tmp_path / "out" / "blob.bin"))
    assert (tmp_path / "out" / "blob.bin").read_bytes() == payload
    assert len(machine.sent) == 4
    assert not list(staging_root.iterdir())


def test_a_failed_copy_raises_and_removes_its_staging(tmp_path: Path, staging_root: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(os.urandom(2 * CHUNK_BYTES))
    (tmp_path / "a-file").write_text("not a directory\n")
    machine = LocalShell()
    with pytest.raises(CommandFailed) as raised:
        machine.copy_to(tmp_path / "blob.bin", str(tmp_path / "a-file" / "blob.bin"))
    assert raised.value.result.rc != 0
    assert not list(staging_root.iterdir())

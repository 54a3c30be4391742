"""The base class's shared behaviour, on a machine that runs commands in a local shell.

These tests need no guest: ``LocalShell`` implements the primitives with ``sh -c`` on the
host, so quoting, observation and ``write_file`` are exercised through the real shell.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from vmtests.driver.machine import CommandResult, Machine, render_command


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

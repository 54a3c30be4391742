"""``vmtests shell`` on the reference guest, driven through a terminal as a person drives it.

The command brings a guest to S1 (the base restored from the snapshot cache, the switch to
cfx-llm2, S1 checked) and opens its Python prompt; there ``machine.succeed`` answers from the
guest and the result has no failures; Ctrl-D leaves, the command exits 0 and no QEMU of the run
is left (``cli_support``: the command runs with its state under the test's directory).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect
import pytest
from cli_support import CLI, CLI_TIMEOUT, cli_environment, qemus_under

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(240)]

PROMPT = ">>> "
ANSWER_TIMEOUT = 120.0
"""Seconds one line at the prompt may take (a command on the guest under TCG)."""


def expect(child: pexpect.spawn, pattern: str, log: Path, timeout: float) -> None:
    """Wait for ``pattern`` (a regular expression) from ``child``; fail with the terminal's
    last output when it does not come."""
    try:
        child.expect(pattern, timeout=timeout)
    except (pexpect.TIMEOUT, pexpect.EOF) as error:
        tail = log.read_text(errors="replace")[-4000:]
        pytest.fail(
            f"no {pattern!r} within {timeout:.0f}s ({type(error).__name__}); the terminal's last "
            f"output:\n{tail}"
        )


@pytest.mark.nightly
def test_the_shell_at_s1_gives_a_prompt_where_the_machine_answers(tmp_path: Path) -> None:
    log = tmp_path / "terminal.log"
    with log.open("w") as logfile:
        child = pexpect.spawn(
            CLI[0], [*CLI[1:], "shell", "--profile", "cfx-llm2", "--stage", "S1"],
            env=cli_environment(tmp_path), encoding="utf-8", dimensions=(50, 200),
        )  # fmt: skip
        child.logfile_read = logfile
        try:
            expect(child, r"S1 reached: profile cfx-llm2 on qemu:reference", log, CLI_TIMEOUT)
            expect(child, r"Ctrl-D \(or exit\(\)\) leaves; the guest is powered off", log, 60)
            expect(child, PROMPT, log, 60)
            child.sendline('machine.succeed("systemctl is-active tenstorrent-serving.service")')
            expect(child, r"'active\\n'", log, ANSWER_TIMEOUT)  # the echoed line has no quote
            expect(child, PROMPT, log, 60)
            child.sendline("result.failures")
            expect(child, r"\[\]", log, 60)
            expect(child, PROMPT, log, 60)
            child.sendeof()  # Ctrl-D
            expect(child, pexpect.EOF, log, 300)
        finally:
            child.close(force=True)
            print(log.read_text(errors="replace")[-6000:], file=sys.stderr)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert qemus_under(tmp_path) == []
    assert not list(tmp_path.glob("vmtests-shell-*"))  # the run's state is gone too

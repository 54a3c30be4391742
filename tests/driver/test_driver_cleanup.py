"""No QEMU or ssh process outlives a test session: failed test, Ctrl-C, or a killed pytest.

Each case runs a child pytest session (with this suite's plugin) that boots a guest or restores
one from the snapshot cache, then fails, is interrupted with SIGINT, or is SIGKILLed. Afterwards
no process whose command line names the child's base temp directory (QEMU's disk, ssh's
known_hosts) may remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from driver_support import processes_matching

pytestmark = pytest.mark.vm

CHILD_TESTS = """
import time
import pytest
from vmtests.guest.access import ssh_to_guest
from vmtests.guest.image import SETTLED

@pytest.mark.parametrize("how", ["booted", "restored"])
def test_opens_ssh_then_fails(reference_guest, tmp_path, how):
    options = {"preparation": SETTLED} if how == "restored" else {}
    guest = reference_guest(name="cleanup", accel="tcg", **options)
    session = ssh_to_guest(guest, tmp_path / "ssh")
    session.start()
    assert session.succeed("echo over-ssh") == "over-ssh\\n"
    assert False, "deliberate failure with a guest and an ssh session open"

def test_boot_forever(reference_guest):
    reference_guest(name="cleanup", accel="tcg", boot_timeout=900)

def test_restored_forever(reference_guest):
    reference_guest(name="cleanup", accel="tcg", preparation=SETTLED)
    time.sleep(900)
"""


def _child(tmp_path: Path, selector: str) -> tuple[subprocess.Popen[str], Path]:
    """Start a child pytest session running the child test named by ``selector``."""
    (tmp_path / "test_child_session.py").write_text(CHILD_TESTS)
    basetemp = tmp_path / "child-basetemp"
    options = ["-q", "-p", "no:cacheprovider", "-k", selector, "-o", "addopts="]
    options.append(f"--basetemp={basetemp}")
    # A job that a shell starts in the background inherits SIGINT ignored (POSIX), and Python
    # then never installs its KeyboardInterrupt handler: give the child Ctrl-C's usual meaning
    # whatever this session inherited, as a terminal's foreground job has it.
    session = (
        "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.exit(pytest.main({[*options, 'test_child_session.py']!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", session],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, basetemp


def _wait_for_qemu(needle: str, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any("qemu-system" in cmd for _, cmd in processes_matching(needle)):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    output = proc.communicate()[0]
    pytest.fail(f"the child session never started QEMU within {timeout}s; output:\n{output}")


def _assert_nothing_left(needle: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    left = processes_matching(needle)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_matching(needle)
    for pid, _ in left:  # do not leak them into the rest of the session
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the child session after {timeout}s: {left}"


@pytest.mark.parametrize("how", [pytest.param("booted", marks=pytest.mark.nightly), "restored"])
def test_nothing_outlives_a_deliberately_failing_test(tmp_path: Path, how: str) -> None:
    proc, basetemp = _child(tmp_path, f"fails and {how}")
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 1, output
    assert "deliberate failure with a guest and an ssh session open" in output
    assert "1 failed" in output
    _assert_nothing_left(str(basetemp))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
@pytest.mark.parametrize("child", ["boot_forever", "restored_forever"])
def test_nothing_outlives_an_interrupted_or_killed_session(
    tmp_path: Path, signum: signal.Signals, child: str
) -> None:
    proc, basetemp = _child(tmp_path, child)
    _wait_for_qemu(str(basetemp), proc)
    proc.send_signal(signum)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, output
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in output
    _assert_nothing_left(str(basetemp))

"""The keeper: QEMU's parent while a run may keep its guest (``vmtests.driver.keep``).

    python3 -m vmtests.driver.keeper -- QEMU_ARGV...

It starts QEMU (which dies with it: PR_SET_PDEATHSIG) and reads its control pipe (stdin). When
QEMU ends, the keeper ends with QEMU's status. When the pipe closes without a ``keep`` line
(the run ended, broke or was killed), it kills QEMU and ends. After ``keep SECONDS STATE_FILE``
it waits for QEMU to end or for SECONDS to pass, and then ends the guest as ``vmtests stop``
does (``keep.stop_kept``), removing what the state file lists.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vmtests.driver import keep, procs
from vmtests.driver.errors import DriverError

POLL = 0.5
"""Seconds between looks at QEMU and at the control pipe."""


def _control(qemu: subprocess.Popen[bytes]) -> str:
    """The control line, or "" once the pipe closed without one or QEMU ended."""
    received = b""
    while qemu.poll() is None:
        ready, _, _ = select.select([0], [], [], POLL)
        if not ready:
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return ""
        received += chunk
        if b"\n" in received:
            return received.split(b"\n", 1)[0].decode()
    return ""


def _kill(qemu: subprocess.Popen[bytes]) -> None:
    if qemu.poll() is None:
        qemu.send_signal(signal.SIGTERM)
        try:
            qemu.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait(timeout=30)


def main(argv: Sequence[str]) -> int:
    """Run QEMU (``argv`` after ``--``) under the keeper's rules; QEMU's exit status."""
    if list(argv[:1]) != ["--"] or len(argv) < 2:
        print("usage: python3 -m vmtests.driver.keeper -- QEMU_ARGV...", file=sys.stderr)
        return 2
    # QEMU dies with the keeper; the keeper runs in the group the run kills (procs.spawn).
    qemu = subprocess.Popen(
        list(argv[1:]),
        stdin=subprocess.DEVNULL,
        preexec_fn=procs.child_setup,  # noqa: PLW1509
    )
    line = _control(qemu).split()
    if qemu.poll() is not None:
        return qemu.returncode
    if len(line) != 3 or line[0] != keep.KEEP_LINE:
        _kill(qemu)
        return qemu.returncode
    keep_for, state_file = float(line[1]), Path(line[2])
    deadline = time.monotonic() + keep_for
    while qemu.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL)
    if qemu.poll() is None:
        try:
            state = keep.read_state(state_file)
        except DriverError as error:
            print(f"vmtests keeper: {error}; killing QEMU", file=sys.stderr)
            _kill(qemu)
            return qemu.returncode
        print(f"vmtests keeper: {keep_for:g}s passed: stopping {state.name}", file=sys.stderr)
        for said in keep.stop_kept(state, from_keeper=True):
            print(f"vmtests keeper: {said}", file=sys.stderr)
        _kill(qemu)  # already ended unless even SIGKILL by pid failed
        return qemu.returncode
    # The guest powered itself off: what it left goes with it, as after a stop.
    if state_file.exists():
        for path in keep.read_state(state_file).remove:
            shutil.rmtree(path, ignore_errors=True)
    return qemu.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

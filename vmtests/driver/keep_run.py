"""What a run does with its machine when it fails and the person asked to ``--keep`` it.

A QEMU guest is handed to its keeper (``QemuMachine.keep``) and the run's state directory
stays, holding the state file; the run prints how to attach and how to stop. A host reached
over ssh is never kept or stopped by us: the run prints the ssh command to it.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vmtests.contracts.deadline import DEFAULT_DEADLINE, DeadlineExceeded
from vmtests.driver import keep
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--keep``, ``--keep-for`` and ``--deadline``: the same on every command that runs."""
    parser.add_argument(
        "--keep",
        action="store_true",
        help="when the run fails (or its deadline passes) on a QEMU guest, leave the guest "
        "running and print how to attach to it and how to stop it; for ssh:// targets, print "
        "the ssh command",
    )
    parser.add_argument(
        "--keep-for",
        type=float,
        default=keep.DEFAULT_KEEP_FOR,
        metavar="SECONDS",
        help="a kept guest powers itself off after this long (default: %(default)g)",
    )
    add_deadline_argument(parser)


def add_deadline_argument(
    parser: argparse.ArgumentParser,
    what: str = "stop the whole run after this long: reports written, machines closed (or kept)",
) -> None:
    """``--deadline`` (``vmtests.contracts.deadline``); ``what`` says what it stops."""
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE,
        metavar="SECONDS",
        help=f"{what}, exit status 3 naming the step (default: %(default)g; 0: none)",
    )


@dataclass
class RunState:
    """A run's state directory (overlays, console logs, sockets): removed at the end unless
    a kept guest lives in it (``kept``)."""

    path: Path
    kept: bool = False


@contextmanager
def run_state(prefix: str) -> Iterator[RunState]:
    """A fresh state directory, removed at the end unless ``kept`` was set."""
    state = RunState(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield state
    finally:
        if not state.kept:
            shutil.rmtree(state.path, ignore_errors=True)


def should_keep(wanted: bool, failed: bool) -> bool:
    """Keep the machine when the person asked (``--keep``) and the run failed, broke or ran
    out of time (``sys.exc_info``) but not when it was interrupted: Ctrl-C means stop."""
    error = sys.exc_info()[1]
    if not wanted:
        return False
    if isinstance(error, KeyboardInterrupt):
        return isinstance(error, DeadlineExceeded)
    return failed or error is not None


def keep_machine(machine: Machine, state: RunState, *, keep_for: float, target: str) -> list[str]:
    """Keep ``machine`` (see the module); the lines to print. Never raises: a machine that
    cannot be kept is closed as usual, and the lines say why."""
    if isinstance(machine, SshMachine):
        argv = machine.ssh_argv("")[:-1]
        return [f"not kept: {target} is a real host; reach it with: {shlex.join(argv)}"]
    if not isinstance(machine, QemuMachine):
        return [f"not kept: {target} is not a QEMU guest"]
    try:
        kept = machine.keep(
            keep.state_path(state.path / keep.STATE_FILE),
            keep_for,
            target=target,
            remove=[state.path],
        )
    except DriverError as error:
        log.warning(f"{machine.name}: not kept: {error}")
        return [f"not kept: {error}"]
    state.kept = True
    where = shlex.quote(str(state.path))
    return [
        f"kept {kept.name} (for {keep_for:g}s at most); attach: vmtests attach {where}",
        f"stop it: vmtests stop {where}",
    ]

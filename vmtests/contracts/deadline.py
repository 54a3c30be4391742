"""A deadline for a whole run (``--deadline``): when it passes, the run stops where it is.

Like nixpkgs' ``globalTimeout`` of a NixOS test (NixOS/nixpkgs, nixos/lib/testing/run.nix),
which bounds the whole test rather than each wait. Here a timer (``SIGALRM``, handled in the
main thread) raises ``DeadlineExceeded``, a ``KeyboardInterrupt``: every path that already
handles Ctrl-C (reports written in ``finally``, the scenario's recovery, the certification's
restore of the starting configuration, the lanes' stop) handles the deadline the same way. The
steps say where they are (``entered``), so the run can name the step it stopped in. A command
whose bounded part is followed by a person's session (``vmtests shell``) ``lift``s it first.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

DEFAULT_DEADLINE = 14400.0
"""Seconds a run may take by default (4 h: a full selftest under TCG takes about 30 min, a
certification on a host up to 2 h); 0 means none."""

_step = ""
_passed: DeadlineExceeded | None = None
_lock = threading.Lock()


class DeadlineExceeded(KeyboardInterrupt):
    """The run's deadline passed during ``step``."""

    def __init__(self, seconds: float, step: str) -> None:
        super().__init__(f"the deadline of {seconds:g}s passed during step {step or '(start)'}")
        self.seconds, self.step = seconds, step or "(start)"


def entered(step: str) -> None:
    """Record that the run is now in ``step`` (the scenario's steps, the certification's gates)."""
    global _step  # noqa: PLW0603  (one run per process, like its deadline)
    with _lock:
        _step = step


def current_step() -> str:
    """The step the run is in ("" before the first)."""
    return _step


def passed() -> DeadlineExceeded | None:
    """The deadline that passed during the present ``run_deadline``, if one did."""
    return _passed


def lift() -> None:
    """No deadline from now on within the present ``run_deadline``: what follows is a person's
    interactive session, which no timer may end. One that passed already stays ``passed``."""
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def run_deadline(seconds: float) -> Iterator[None]:
    """Raise ``DeadlineExceeded`` in the main thread once ``seconds`` have passed (0: never).

    Outside the main thread (where no signal can be handled) there is no deadline.
    """
    global _passed  # noqa: PLW0603
    _passed = None
    entered("")
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: FrameType | None) -> None:
        global _passed  # noqa: PLW0603
        if _passed is None:  # once: the cleanup that follows must be allowed to finish
            _passed = DeadlineExceeded(seconds, current_step())
            raise _passed

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

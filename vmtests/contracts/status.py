"""How a run of the suite ends, the same for every command: its status while it runs and after,
the exit status of ``vmtests``, and the error that means bad arguments.

``vmtests run`` and ``selftest`` (``vmtests.cli``) and ``vmtests certify``
(``vmtests.certify.command``) share them, and the reports write the status as it is here.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class RunStatus(StrEnum):
    """Where a run is: running, or how it ended."""

    RUNNING = "running"
    FINISHED = "finished"
    REFUSED = "refused"  # the certification's preflight refused the host; nothing was touched
    INTERRUPTED = "interrupted"  # Ctrl-C
    ERROR = "error"  # the run itself broke (a driver error, an unexpected exception)


class ExitStatus(IntEnum):
    """The exit status of ``vmtests``: 0 every check held (certified), 1 a check or gate
    failed or a control went undetected, 2 bad arguments, 3 the run could not complete (a
    driver error, a refused preflight, a gate that could not be judged, an interrupted
    certification), 130 Ctrl-C."""

    OK = 0
    FAILED = 1
    USAGE = 2
    INCOMPLETE = 3
    INTERRUPTED = 130


class UsageError(Exception):
    """A bad argument or argument combination: the command says why and exits with
    ``ExitStatus.USAGE``."""

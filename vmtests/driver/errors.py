"""Typed driver errors: every failure says what was awaited, for how long, and what was seen."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vmtests.driver.machine import CommandResult


class DriverError(Exception):
    """Base class of every error the driver raises."""


class RequestedAssertionFailed(AssertionError):
    """The machine is not in the state a test required (a unit not in the state asked for, a
    property that cannot be read): a failed check of the machine, not a broken run.

    Named as the nixpkgs test driver names its own (``nixos/lib/test-driver/src/test_driver/
    errors.py`` in NixOS/nixpkgs). ``CommandFailed`` stays a ``DriverError``: callers catch it as
    one (the scenario records a ``DriverError`` as a failed check), and moving it would change
    what they catch.
    """


class UnitWillNotStart(DriverError):
    """A wait for a unit to become active ended early: the unit is ``failed``, or ``inactive``
    with nothing left that could start it. ``diagnostics`` holds its status and journal tail."""

    def __init__(self, unit: str, state: str, why: str, diagnostics: str) -> None:
        self.unit = unit
        self.state = state
        self.diagnostics = diagnostics
        super().__init__(f"unit {unit} {why} while waiting for 'active'\n{diagnostics}")


class MachineGone(DriverError):
    """The machine stopped answering: QEMU exited, the console closed, or ssh lost the host."""


class WaitTimeout(DriverError):
    """A bounded wait ran out.

    ``awaited`` names what was waited for, ``timeout`` how long, and ``last_seen`` carries the
    evidence (console tail, ``systemctl status``, journal lines) for the failure message.
    """

    def __init__(self, awaited: str, timeout: float, last_seen: str = "") -> None:
        self.awaited = awaited
        self.timeout = timeout
        self.last_seen = last_seen
        message = f"timed out after {timeout:.1f}s waiting for {awaited}"
        if last_seen:
            message += f"\n--- last seen ---\n{last_seen.rstrip()}"
        super().__init__(message)


COMMAND_NOT_FOUND = 127
"""The shell's exit status for a program it could not find on PATH."""

_NOT_FOUND_RE = re.compile(r"(?:^|\s)(?:\S+: )?(?:line \d+: |\d+: )?(\S+?): (?:command )?not found")
"""dash (``sh: 1: ss: not found``), bash (``sh: line 1: ss: command not found``) and
``env``/``timeout`` style (``timeout: failed to run command 'ss': No such file ...``)."""
_FAILED_TO_RUN_RE = re.compile("failed to run command [\u2018'`]([^\u2019'`]+)[\u2019'`]")


def missing_programs(stderr: str) -> list[str]:
    """The programs a shell reported as not found in ``stderr``, in order, without repeats."""
    found = [m.group(1) for m in _NOT_FOUND_RE.finditer(stderr)]
    found += [m.group(1) for m in _FAILED_TO_RUN_RE.finditer(stderr)]
    return list(dict.fromkeys(found))


def not_found_explanation(result: CommandResult) -> str:
    """For rc 127: which program was missing, and that guests run only the tool manifest."""
    programs = missing_programs(result.stderr_text)
    named = ", ".join(f"`{program}`" for program in programs) or "a program (no name on stderr)"
    return (
        f"{named} not found on the machine's PATH (rc {COMMAND_NOT_FOUND}). Guests run suite "
        "commands with exactly the programs of the instrumentation contract's tool manifest "
        "(`tools` in vmtests/contracts/instrumentation.json), as the NixOS backdoor's `path` "
        "does: a program that is not in the manifest is not in the guest; add it there with "
        "the nixpkgs package that provides it"
    )


class CommandFailed(DriverError):
    """A command did not end as required (``succeed`` got rc != 0, ``fail`` got rc == 0).

    For rc 127 the message starts by naming the program that was not found and the tool
    manifest that decides which programs a guest has.
    """

    def __init__(self, result: CommandResult, expectation: str = "exit status 0") -> None:
        self.result = result
        self.missing = (
            missing_programs(result.stderr_text) if result.rc == COMMAND_NOT_FOUND else []
        )
        hint = not_found_explanation(result) + "\n" if result.rc == COMMAND_NOT_FOUND else ""
        super().__init__(
            f"{hint}command {result.command!r} returned rc={result.rc}, expected {expectation}\n"
            f"--- stdout ---\n{result.stdout_text.rstrip()}\n"
            f"--- stderr ---\n{result.stderr_text.rstrip()}"
        )

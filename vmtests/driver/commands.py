"""What the driver sends to a machine and reads back: a command rendered with quoted
arguments, its result, ``systemctl show``'s output, and the default bounds of both."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

DEFAULT_COMMAND_TIMEOUT = 120.0
DEFAULT_WAIT_TIMEOUT = 300.0


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command: exit status and both output streams, kept separate."""

    command: str
    rc: int
    stdout: bytes
    stderr: bytes
    duration: float = 0.0

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8, undecodable bytes replaced."""
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8, undecodable bytes replaced."""
        return self.stderr.decode("utf-8", errors="replace")


def render_command(command: str, args: tuple[object, ...]) -> str:
    """``command % args`` with every argument shell-quoted; ``command`` itself when no args.

    A list or tuple argument becomes its items, each quoted, separated by spaces. With
    arguments, a literal ``%`` in ``command`` is written ``%%``.
    """
    if not args:
        return command

    def quote(value: object) -> str:
        if isinstance(value, list | tuple):
            return " ".join(shlex.quote(str(item)) for item in value)
        return shlex.quote(str(value))

    return command % tuple(quote(value) for value in args)


def show_values(text: str) -> dict[str, str]:
    """``systemctl show``'s ``Key=value`` lines as a dict (a value may hold ``=``)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def describe_last(results: list[CommandResult]) -> str:
    """The last result a retried command gave (a wait's ``last_seen``), outputs cut to 2000
    characters each."""
    if not results:
        return "(the command never completed)"
    result = results[0]
    return (
        f"rc={result.rc}\nstdout: {result.stdout_text.rstrip()[-2000:]}\n"
        f"stderr: {result.stderr_text.rstrip()[-2000:]}"
    )

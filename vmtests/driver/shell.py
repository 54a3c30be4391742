"""Framed command execution over a plain shell stream (the virtio-port backdoor, or ssh's stdio).

Both backends talk to a POSIX ``sh`` that reads commands from its stdin. Each command is sent
as one line that

- carries the command single-quoted for ``sh -c`` (``shlex.quote``: any text, any newlines),
- runs it under ``timeout`` in the guest, so a hung command is killed *there* and the shell
  stays usable,
- keeps stdout and stderr in separate files, then prints a frame::

      \\n__VMT_BEGIN__ <nonce> <rc>\\n<base64 stdout>\\n<base64 stderr>\\n__VMT_END__ <nonce>\\n

Base64 makes binary output safe; the per-command nonce means bytes left over from an earlier
command, an earlier boot or the shell's own chatter can never be mistaken for this result.
"""

from __future__ import annotations

import base64
import re
import secrets
import shlex
import time
from typing import Protocol

from vmtests.driver.errors import MachineGone, WaitTimeout
from vmtests.driver.machine import CommandResult

KILL_GRACE = 5
"""Seconds ``timeout`` waits after SIGTERM before it SIGKILLs a timed-out command."""
HOST_SLACK = 15.0
"""Extra seconds the host waits for a frame beyond the command's own timeout."""
TIMEOUT_STATUSES = (124, 137)
"""Exit statuses of coreutils ``timeout`` when it had to stop the command."""


class Transport(Protocol):
    """A bidirectional byte stream to a shell."""

    def send(self, data: bytes) -> None:
        """Write all of ``data``."""

    def recv(self, timeout: float) -> bytes:
        """Return available bytes (b"" when ``timeout`` passes); raise ``MachineGone`` on EOF."""

    def describe_failure(self) -> str:
        """Evidence for error messages (e.g. the console tail)."""


class ShellChannel:
    """Runs commands over a ``Transport`` with the framing described in the module docstring."""

    def __init__(self, transport: Transport, name: str) -> None:
        self.transport = transport
        self.name = name
        self._buffer = bytearray()

    def wait_for(
        self, pattern: re.Pattern[bytes], deadline: float, awaited: str
    ) -> re.Match[bytes]:
        """Read until ``pattern`` matches the stream; consume the stream up to the match end."""
        start = time.monotonic()
        scan_from = 0
        while True:
            match = pattern.search(self._buffer, scan_from)
            if match is not None:
                # Return a match over an immutable copy: the buffer is about to shrink.
                data = bytes(self._buffer[: match.end()])
                del self._buffer[: match.end()]
                result = pattern.search(data, match.start())
                assert result is not None
                return result
            # Markers are short: rescan only the tail that could hold a split marker.
            scan_from = max(0, len(self._buffer) - 200)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = bytes(self._buffer[-2000:]).decode("utf-8", errors="replace")
                raise WaitTimeout(
                    f"{awaited} on {self.name}",
                    time.monotonic() - start,
                    f"unconsumed stream tail: {tail!r}\n{self.transport.describe_failure()}",
                )
            try:
                self._buffer += self.transport.recv(min(remaining, 1.0))
            except MachineGone as gone:
                # What the peer printed last (e.g. ssh's "Host key verification failed") is
                # the explanation: keep it in the error.
                tail = bytes(self._buffer[-2000:]).decode("utf-8", errors="replace")
                raise MachineGone(f"{gone}\nlast output: {tail!r}") from gone

    def run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` through ``sh``; return its rc, stdout and stderr.

        Raises ``WaitTimeout`` when it ran out of time (killed in the guest, the shell stays
        usable) and ``MachineGone`` when the stream closed.
        """
        nonce = secrets.token_hex(8)
        seconds = max(1, int(timeout + 0.999))
        # One scratch dir per shell session, so a command costs no mktemp; `[` and
        # printf are builtins, and an empty stream costs no base64 process.
        line = (
            '[ -d "$__d" ] || __d=$(mktemp -d); '
            f"timeout -k {KILL_GRACE} {seconds} sh -c {shlex.quote(command)} "
            '> "$__d/o" 2> "$__d/e" < /dev/null; __r=$?; '
            f"printf '\\n__VMT_BEGIN__ %s %s\\n' {nonce} \"$__r\"; "
            '[ -s "$__d/o" ] && base64 -w0 "$__d/o"; printf \'\\n\'; '
            '[ -s "$__d/e" ] && base64 -w0 "$__d/e"; '
            f"printf '\\n__VMT_END__ %s\\n' {nonce}\n"
        )
        start = time.monotonic()
        self.transport.send(line.encode())
        deadline = start + seconds + KILL_GRACE + HOST_SLACK
        awaited = f"command {shlex.quote(command)[:200]} (timeout {timeout:.0f}s)"
        begin = self.wait_for(
            re.compile(rb"\n__VMT_BEGIN__ " + nonce.encode() + rb" (\d+)\r?\n"), deadline, awaited
        )
        end = self.wait_for(
            re.compile(rb"\r?\n__VMT_END__ " + nonce.encode() + rb"\r?\n"), deadline, awaited
        )
        duration = time.monotonic() - start
        body = end.string[: end.start()]
        out_b64, _, err_b64 = body.partition(b"\n")
        result = CommandResult(
            command=command,
            rc=int(begin.group(1)),
            stdout=base64.b64decode(out_b64.strip()),
            stderr=base64.b64decode(err_b64.strip()),
            duration=duration,
        )
        if result.rc in TIMEOUT_STATUSES and duration >= seconds:
            raise WaitTimeout(
                f"command {command!r} on {self.name} to finish (killed in the guest)",
                duration,
                f"rc={result.rc}\nstdout tail: {result.stdout_text[-1000:]}\n"
                f"stderr tail: {result.stderr_text[-1000:]}",
            )
        return result


REBOOT_COMMAND = "setsid -f sh -c 'exec > /dev/null 2>&1 < /dev/null; sleep 1; systemctl reboot'"
"""Reboot request that returns at once: systemd kills the shell while it stops units, so a
plain ``systemctl reboot`` could take the command's result frame down with it. The detached
shell drops its own output; a ``setsid`` that cannot be found still says so on stderr (rc 127)."""
POWEROFF_COMMAND = REBOOT_COMMAND.replace("systemctl reboot", "systemctl poweroff")
"""Poweroff request that returns at once, as ``REBOOT_COMMAND``."""

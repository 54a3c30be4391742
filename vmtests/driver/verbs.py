"""The nixpkgs test driver's verbs on our ``Machine``: names, arguments and meaning mirrored
from ``nixos/lib/test-driver/src/test_driver/machine/__init__.py`` in NixOS/nixpkgs where they
fit, built on ``Machine``'s own primitives (``execute``, ``_poll``, ``copy_to``, ``copy_from``).

``MachineVerbs`` is a mixin that ``Machine`` inherits; its methods say through their ``self``
type (``_Primitives``) which ``Machine`` methods they use. Every wait is bounded and raises
``WaitTimeout`` naming what it awaited, for how long, and what it saw last; a state the test
required but the machine is not in raises ``RequestedAssertionFailed``. docs/machine-api.md
sets each verb beside nixpkgs'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from vmtests.driver.commands import (
    DEFAULT_WAIT_TIMEOUT,
    CommandResult,
    describe_last,
    render_command,
    show_values,
)
from vmtests.driver.errors import RequestedAssertionFailed
from vmtests.driver.log import log

PROBE_TIMEOUT = 30.0
"""Seconds one probe command of a wait may take; the wait's own deadline bounds the whole."""
SOCKET_TYPES = {False: "u_str", True: "u_dgr"}
"""``ss -x``'s type column of a stream and of a datagram UNIX socket, by ``is_datagram``."""


def tcp_probe(address: str, port: int) -> str:
    """A command that exits 0 when ``address:port`` accepts a TCP connection.

    bash's ``/dev/tcp`` exists on NixOS, Debian and the P150 hosts alike: no ``nc`` needed
    (nixpkgs' driver runs ``nc -z``; our guests have only the tool manifest's programs).
    """
    return f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{int(port)}'"


LISTENING_TCP = "ss -ltnp 2>&1 | tail -n 20"
"""What a port wait shows as last seen: the machine's listening TCP sockets."""


class _Primitives(Protocol):
    """The ``Machine`` methods the verbs are built on."""

    name: str

    def execute(self, command: str, *args: object, timeout: float = ...) -> CommandResult: ...

    def copy_to(self, source: Path, destination: str, timeout: float = ...) -> None: ...

    def copy_from(self, source: str, destination: Path, timeout: float = ...) -> None: ...

    def unit_diagnostics(self, unit: str) -> str: ...

    def systemctl(self, query: str, *args: object) -> CommandResult: ...

    def get_unit_info(self, unit: str) -> dict[str, str]: ...

    def _wait_until_down(self, deadline: float) -> None: ...

    def _poll(
        self,
        attempt: Callable[[], bool],
        deadline: float,
        awaited: str,
        last_seen: Callable[[], str],
        *,
        backoff: bool = True,
    ) -> None: ...


class MachineVerbs:
    """nixpkgs' verbs, on any ``Machine`` (QEMU guest or ssh host)."""

    # ---- waits ---------------------------------------------------------------------------

    def wait_until_fails(
        self: _Primitives, command: str, *args: object, timeout: float = DEFAULT_WAIT_TIMEOUT
    ) -> CommandResult:
        """Retry ``command`` (``%s`` filled with the quoted ``args``, see ``execute``) until it
        exits non-zero; return that result. ``WaitTimeout`` shows its last output."""
        __tracebackhide__ = True
        rendered = render_command(command, args)
        last: list[CommandResult] = []
        deadline = time.monotonic() + timeout

        def attempt() -> bool:
            remaining = max(1.0, deadline - time.monotonic())
            last[:] = [self.execute(rendered, timeout=min(remaining, PROBE_TIMEOUT))]
            return last[0].rc != 0

        with log.nested(f"waiting until {rendered!r} fails"):
            self._poll(attempt, deadline, f"{rendered!r} to fail", lambda: describe_last(last))
        return last[0]

    def wait_for_file(self: _Primitives, path: str, timeout: float = DEFAULT_WAIT_TIMEOUT) -> None:
        """Wait until ``path`` exists on the machine (any type: ``test -e``)."""
        __tracebackhide__ = True
        with log.nested(f"waiting for file {path}"):
            self._poll(
                lambda: self.execute("test -e %s", path, timeout=PROBE_TIMEOUT).rc == 0,
                time.monotonic() + timeout,
                f"file {path} to exist",
                lambda: (
                    self.execute(
                        'ls -la "$(dirname %s)" 2>&1 | tail -n 20', path, timeout=PROBE_TIMEOUT
                    ).stdout_text
                ),
            )

    def wait_for_closed_port(
        self: _Primitives,
        port: int,
        address: str = "127.0.0.1",
        timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        """Wait until nothing accepts TCP connections on ``address:port`` on the machine."""
        __tracebackhide__ = True
        probe = tcp_probe(address, port)
        with log.nested(f"waiting for port {address}:{port} to close"):
            self._poll(
                lambda: self.execute(probe, timeout=10).rc != 0,
                time.monotonic() + timeout,
                f"port {address}:{port} to stop accepting connections",
                lambda: self.execute(LISTENING_TCP, timeout=10).stdout_text,
            )

    def wait_for_open_unix_socket(
        self: _Primitives,
        path: str,
        is_datagram: bool = False,
        timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        """Wait until a UNIX-domain socket of the kind asked for (stream unless
        ``is_datagram``) is bound at ``path`` and, for a stream, listening.

        ``ss -x`` reads the kernel's socket table (nixpkgs connects with ``nc -U``, which our
        guests lack): a file left behind by a dead server is not a socket in that table.
        """
        __tracebackhide__ = True
        kind = SOCKET_TYPES[is_datagram]
        listed = "ss -H -x -l src %s"
        with log.nested(f"waiting for UNIX socket {path} ({kind})"):
            self._poll(
                lambda: any(
                    line.split()[:1] == [kind]
                    for line in self.execute(
                        listed, path, timeout=PROBE_TIMEOUT
                    ).stdout_text.splitlines()
                ),
                time.monotonic() + timeout,
                f"a {kind} UNIX socket bound at {path}",
                lambda: (
                    self.execute(listed, path, timeout=PROBE_TIMEOUT).stdout_text
                    or f"no listening UNIX socket at {path}"
                ),
            )

    def wait_for_shutdown(self: _Primitives, timeout: float = DEFAULT_WAIT_TIMEOUT) -> None:
        """Wait until the machine has powered off (QEMU exited; the ssh session ended). Does
        not ask it to: something else did (``systemctl poweroff`` in a command, the guest)."""
        __tracebackhide__ = True
        with log.nested(f"waiting for {self.name} to power off"):
            self._wait_until_down(time.monotonic() + timeout)

    # ---- systemd -------------------------------------------------------------------------

    def systemctl(self: _Primitives, query: str, *args: object) -> CommandResult:
        """Run ``systemctl <query>`` (``%s`` filled with the quoted ``args``); rc not checked.

        nixpkgs' ``user=`` (``systemctl --user`` through ``su``) is left out: no test here has
        a user manager.
        """
        return self.execute(f"systemctl {query}", *args)

    def start_job(self: _Primitives, unit: str) -> CommandResult:
        """``systemctl start unit``; rc not checked (a refused start is rc != 0)."""
        return self.systemctl("start %s", unit)

    def stop_job(self: _Primitives, unit: str) -> CommandResult:
        """``systemctl stop unit``; rc not checked."""
        return self.systemctl("stop %s", unit)

    def get_unit_info(self: _Primitives, unit: str) -> dict[str, str]:
        """All of ``systemctl show unit`` as a dict. A ``systemctl`` that fails raises
        ``RequestedAssertionFailed``."""
        __tracebackhide__ = True
        shown = self.systemctl("--no-pager show %s", unit)
        if shown.rc != 0:
            raise RequestedAssertionFailed(
                f"systemctl show {unit} failed (rc={shown.rc}): {shown.stderr_text.strip()}"
            )
        return show_values(shown.stdout_text)

    def get_unit_property(self: _Primitives, unit: str, property_name: str) -> str:
        """One property of ``systemctl show unit``. A ``systemctl`` that fails or an unknown
        property raises ``RequestedAssertionFailed``."""
        __tracebackhide__ = True
        shown = self.systemctl("--no-pager show %s -p %s", unit, property_name)
        values = show_values(shown.stdout_text)
        if shown.rc != 0 or property_name not in values:
            raise RequestedAssertionFailed(
                f"systemctl show {unit} -p {property_name} gave no value (rc={shown.rc}): "
                f"{(shown.stdout_text + shown.stderr_text).strip() or '(no output)'}"
            )
        return values[property_name]

    def require_unit_state(self: _Primitives, unit: str, require_state: str = "active") -> None:
        """Assert that ``unit``'s ``ActiveState`` is ``require_state`` now; raise
        ``RequestedAssertionFailed`` with the unit's status and journal when it is not."""
        __tracebackhide__ = True
        with log.nested(f"checking that unit {unit} is {require_state}"):
            state = self.get_unit_info(unit).get("ActiveState", "")
            if state != require_state:
                raise RequestedAssertionFailed(
                    f"unit {unit} is in state {state!r}, expected {require_state!r}\n"
                    + self.unit_diagnostics(unit)
                )

    # ---- files ---------------------------------------------------------------------------

    def copy_from_host(self: _Primitives, source: Path | str, target: str) -> None:
        """Copy host file or directory ``source`` to ``target`` on the machine (``copy_to``:
        a directory's contents are merged into ``target``)."""
        self.copy_to(Path(source), target)

    def copy_from_machine(self: _Primitives, source: str, target_dir: Path | str) -> Path:
        """Copy file or directory ``source`` on the machine into host directory
        ``target_dir``, under its own name; return the host path. nixpkgs copies under its
        ``$out``; a ``Machine`` has no output directory, so the caller names one."""
        destination = Path(target_dir) / Path(source.rstrip("/")).name
        self.copy_from(source, destination)
        return destination

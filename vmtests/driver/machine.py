"""The ``Machine`` interface: one API for the QEMU backend and the SSH backend.

The scenario, checks and hardware gates only ever talk to a ``Machine``, so the steps run on a
VM and on a real P150 host are the same code. Backends implement the private primitives
(``_start``, ``_shutdown``, ``_crash``, ``_close``, ``_run``, ``_issue_reboot``,
``_wait_until_answering``); the public methods built on top of them live here once, and each
public call is reported to the observers registered with ``observe`` (the scenario meters its
driver time that way).

``CommandResult`` and ``render_command`` live in ``vmtests.driver.commands`` (the verbs of
``vmtests.driver.verbs`` need them too) and are imported from here as well.

Values reach guest commands quoted by the driver, as in testinfra's ``run("cmd %s", arg)``:
``machine.succeed("cat %s", path)`` quotes ``path`` with ``shlex.quote`` (a list or tuple
becomes several quoted words). Without arguments the command is sent as written.
"""

from __future__ import annotations

import abc
import base64
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeAlias, runtime_checkable

from vmtests.contracts.settings import Settings
from vmtests.driver import transfer
from vmtests.driver.commands import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT,
    describe_last,
    show_values,
)
from vmtests.driver.commands import CommandResult as CommandResult  # noqa: PLC0414 (re-export)
from vmtests.driver.commands import render_command as render_command  # noqa: PLC0414 (re-export)
from vmtests.driver.errors import CommandFailed, DriverError, UnitWillNotStart, WaitTimeout
from vmtests.driver.http_probe import http_status
from vmtests.driver.log import log
from vmtests.driver.verbs import LISTENING_TCP, MachineVerbs, tcp_probe

DEFAULT_REBOOT_TIMEOUT = Settings().reboot_timeout
"""The reboot setting's default (``vmtests.contracts.settings``); callers pass the setting."""
RETRY_INTERVAL = 0.5
MAX_RETRY_INTERVAL = 2.0
"""A poll that runs a command on the machine backs off from ``RETRY_INTERVAL`` to this: each
try costs the machine CPU (a ``systemctl show`` is a noticeable part of a second under TCG,
docs/ci-time.md), taken from the boot or start being awaited. Polls from the host
(``wait_for_http_ok`` through a forward) do not."""
JOURNAL_TAIL_LINES = 40
BOOTING_STATES = ("initializing", "starting")
"""systemd ``SystemState`` values of a boot still under way (``systemctl is-system-running``)."""
SHOW_SEPARATOR = "--vmtests-show--"


@runtime_checkable
class Reconnecting(Protocol):
    """A machine reached over a session that can drop while the machine keeps running (ssh)."""

    @property
    def reboot_pending(self) -> bool:
        """True from a reboot request until a new boot answered (a Ctrl-C may end the wait in
        between): the session still open may be the old boot's, going down."""

    def reconnect(self, timeout: float | None = None) -> None:
        """Open the session again within ``timeout`` (the machine's own default when None);
        with a reboot pending, to a new boot only."""


Observer: TypeAlias = Callable[[str, float, CommandResult | None], None]
"""Called after each public ``Machine`` call with its name, its seconds and, for ``execute``,
its result. Calls made inside another public call (the commands of a ``copy_to``) are not
reported again: the outer call's time already holds them."""


class Machine(MachineVerbs, abc.ABC):
    """A machine under test: a QEMU guest or a real host reached over ssh.

    The nixpkgs driver's verbs come from ``MachineVerbs`` (``vmtests.driver.verbs``).
    """

    name: str
    _observers: list[Observer]
    _depth: int

    # ---- primitives every backend implements -------------------------------------------------

    @abc.abstractmethod
    def _start(self) -> None:
        """Start the machine (or connect to it) and wait until commands can run."""

    @abc.abstractmethod
    def _shutdown(self, timeout: float) -> None:
        """Power the machine off cleanly and wait until it is gone."""

    @abc.abstractmethod
    def _crash(self) -> None:
        """Power the machine off hard, without a clean shutdown."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release everything the backend holds (QEMU killed, ssh session closed); idempotent."""

    @abc.abstractmethod
    def _run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` (already rendered) as root through ``sh -c``."""

    @abc.abstractmethod
    def _issue_reboot(self) -> None:
        """Ask the machine to reboot and return without waiting."""

    @abc.abstractmethod
    def _wait_until_answering(self, deadline: float) -> None:
        """Block until commands run again after a reboot, or raise ``WaitTimeout`` at deadline."""

    def _wait_until_down(self, deadline: float) -> None:
        """Block until the machine has powered off (``wait_for_shutdown``), or raise
        ``WaitTimeout`` at ``deadline``. Not abstract: a machine that cannot tell refuses."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell when it powered off")

    # ---- observation -------------------------------------------------------------------------

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer(name, seconds, result)`` after every outermost public call.

        Returns a function that stops the observation.
        """
        observers: list[Observer] = self.__dict__.setdefault("_observers", [])
        observers.append(observer)
        return lambda: observers.remove(observer)

    @contextmanager
    def _observed(self, name: str, result: list[CommandResult]) -> Iterator[None]:
        """Time the block; report it to the observers unless it runs inside another call."""
        depth = self.__dict__.get("_depth", 0)
        self._depth = depth + 1
        start = time.monotonic()
        try:
            yield
        finally:
            self._depth = depth
            if depth == 0:
                seconds = time.monotonic() - start
                for observer in self.__dict__.get("_observers", []):
                    observer(name, seconds, result[0] if result else None)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the machine (or connect to it) and wait until commands can run."""
        with self._observed("start", []):
            self._start()

    def shutdown(self, timeout: float = DEFAULT_REBOOT_TIMEOUT) -> None:
        """Power the machine off cleanly and wait until it is gone."""
        with self._observed("shutdown", []):
            self._shutdown(timeout)

    def crash(self) -> None:
        """Power the machine off hard, without a clean shutdown."""
        with self._observed("crash", []):
            self._crash()

    def close(self) -> None:
        """Release everything the backend holds (QEMU killed, ssh session closed); idempotent."""
        with self._observed("close", []):
            self._close()

    def __enter__(self) -> Self:
        """Start the machine when entering a ``with`` block."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the machine when leaving the block, whatever happened."""
        self.close()

    # ---- commands ----------------------------------------------------------------------------

    def execute(
        self, command: str, *args: object, timeout: float = DEFAULT_COMMAND_TIMEOUT
    ) -> CommandResult:
        """Run ``command`` (``%s`` filled with the quoted ``args``) as root through ``sh -c``.

        Returns rc, stdout and stderr. Raises ``WaitTimeout`` when the command runs longer than
        ``timeout`` (the machine stays usable) and ``MachineGone`` when the machine stops
        answering.
        """
        rendered = render_command(command, args)
        result: list[CommandResult] = []
        with self._observed("execute", result):
            result.append(self._run(rendered, timeout))
        return result[0]

    def succeed(self, command: str, *args: object, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> str:
        """Run ``command`` (see ``execute``); return stdout; raise ``CommandFailed`` on rc != 0."""
        result = self.execute(command, *args, timeout=timeout)
        if result.rc != 0:
            raise CommandFailed(result)
        return result.stdout_text

    def fail(self, command: str, *args: object, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> str:
        """Run ``command`` (see ``execute``); return stderr; raise ``CommandFailed`` on rc == 0."""
        result = self.execute(command, *args, timeout=timeout)
        if result.rc == 0:
            raise CommandFailed(result, expectation="a non-zero exit status")
        return result.stderr_text

    def copy_to(self, source: Path, destination: str, timeout: float = 120.0) -> None:
        """Copy a host file or directory to ``destination`` on the machine (through commands)."""
        with (
            log.nested(f"copying {source} to {self.name}:{destination}"),
            self._observed("copy_to", []),
        ):
            transfer.copy_to(self, source, destination, timeout)

    def copy_from(self, source: str, destination: Path, timeout: float = 120.0) -> None:
        """Copy a file or directory at ``source`` on the machine to the host (through commands)."""
        with (
            log.nested(f"copying {self.name}:{source} to {destination}"),
            self._observed("copy_from", []),
        ):
            transfer.copy_from(self, source, destination, timeout)

    def write_file(self, path: str, text: str, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> None:
        """Write ``text`` to ``path`` atomically (see ``write_files``)."""
        self.write_files({path: text}, timeout=timeout)

    def write_files(
        self, files: Mapping[str, str], timeout: float = DEFAULT_COMMAND_TIMEOUT
    ) -> None:
        """Write each ``path: text`` atomically (a temporary file renamed into place), in one
        command: under TCG every round trip costs a second or more.

        Parent directories are created. The texts travel base64-encoded in the command, so they
        may hold any characters; keep them under about 90 KiB together (one argument).
        """
        steps, args = [], []
        for path, text in files.items():
            steps.append('mkdir -p "$(dirname %s)" && printf %%s %s | base64 -d > %s && mv %s %s')
            tmp = f"{path}.tmp"
            args += [path, base64.b64encode(text.encode()).decode(), tmp, tmp, path]
        if steps:
            with self._observed("write_files", []):
                self.succeed(" && ".join(steps), *args, timeout=timeout)

    def wait_until_succeeds(
        self, command: str, *args: object, timeout: float = DEFAULT_WAIT_TIMEOUT
    ) -> CommandResult:
        """Retry ``command`` (see ``execute``) until it exits 0; raise ``WaitTimeout`` with its
        last output."""
        __tracebackhide__ = True
        command = render_command(command, args)
        last: list[CommandResult] = []

        def attempt() -> bool:
            remaining = max(1.0, deadline - time.monotonic())
            result = self.execute(command, timeout=min(remaining, DEFAULT_COMMAND_TIMEOUT))
            last[:] = [result]
            return result.rc == 0

        deadline = time.monotonic() + timeout
        with log.nested(f"waiting until {command!r} succeeds"):
            self._poll(attempt, deadline, f"{command!r} to succeed", lambda: describe_last(last))
        return last[0]

    def wait_for_unit(self, unit: str, timeout: float = DEFAULT_WAIT_TIMEOUT) -> None:
        """Wait until ``unit`` is active; stop at once when it never will.

        Raises ``UnitWillNotStart`` (with ``unit_diagnostics``) when the unit is ``failed``, or
        when it is ``inactive`` with no job of its own while the whole manager has no job queued
        (``NJobs=0``) and is not booting (``SystemState`` neither ``initializing`` nor
        ``starting``): nothing is left that would start it, e.g. a unit not enabled for this
        boot. The manager-wide test, as nixpkgs' ``wait_for_unit`` does with ``list-jobs``
        (``nixos/lib/test-driver/src/test_driver/machine/__init__.py`` in NixOS/nixpkgs), and
        not the unit's own job alone: systemd queues a boot's or a ``start``'s whole transaction
        at once, so a unit in it has a job from the start, but a unit started later by another
        unit (a path, socket or ``ExecStartPost=systemctl start``) has none until that one runs,
        and that one's own job is still queued then. A unit that only a later event starts (a
        timer's elapse, a connection to an idle socket) fails the wait, as in nixpkgs.

        One ``systemctl show`` per poll (under TCG each costs a noticeable part of a second);
        the manager is asked, and the unit again after it, only when the unit looks
        abandoned. A timeout raises ``WaitTimeout`` with the same diagnostics.
        """
        __tracebackhide__ = True
        state: list[str] = [""]

        def attempt() -> bool:
            __tracebackhide__ = True
            unit_now = self._unit_state(unit)
            state[0] = unit_now.get("ActiveState", "")
            if state[0] == "failed":
                raise UnitWillNotStart(
                    unit, state[0], "entered state 'failed'", self.unit_diagnostics(unit)
                )
            if state[0] == "inactive" and not unit_now.get("Job"):
                self._fail_if_abandoned(unit)
            return state[0] == "active"

        deadline = time.monotonic() + timeout
        with log.nested(f"waiting for unit {unit}"):
            self._poll(
                attempt,
                deadline,
                f"unit {unit} to become active",
                lambda: f"ActiveState={state[0]}\n" + self.unit_diagnostics(unit),
            )

    def _unit_state(self, unit: str) -> dict[str, str]:
        """The unit's ``ActiveState`` and ``Job`` (absent when it has no job)."""
        shown = self.execute("systemctl show -p ActiveState,Job %s", unit, timeout=30)
        return show_values(shown.stdout_text)

    def _fail_if_abandoned(self, unit: str) -> None:
        """Raise ``UnitWillNotStart`` when ``unit`` is inactive, jobless, and the manager has no
        job and is not booting. The unit is read again after the manager: a job queued and
        finished between two separate reads would otherwise look like none."""
        __tracebackhide__ = True
        shown = self.execute(
            "systemctl show -p NJobs,SystemState && echo %s && "
            "systemctl show -p ActiveState,Job %s",
            SHOW_SEPARATOR,
            unit,
            timeout=30,
        ).stdout_text
        manager_text, _, unit_text = shown.partition(SHOW_SEPARATOR)
        manager, unit_now = show_values(manager_text), show_values(unit_text)
        idle = manager.get("NJobs") == "0" and manager.get("SystemState") not in BOOTING_STATES
        if idle and unit_now.get("ActiveState") == "inactive" and not unit_now.get("Job"):
            raise UnitWillNotStart(
                unit,
                "inactive",
                "is 'inactive' with no job queued, and the system has no job left "
                f"(SystemState={manager.get('SystemState')}): nothing will start it",
                self.unit_diagnostics(unit),
            )

    def host_address(self, port: int) -> tuple[str, int] | None:
        """``(host, port)`` on which the host running the suite reaches the machine's TCP
        ``port`` directly (a QEMU forwarded port), or None: then only a command on the machine
        reaches it."""
        return None

    def wait_for_http_ok(
        self,
        port: int,
        path: str,
        timeout: float = DEFAULT_WAIT_TIMEOUT,
        unit: str | None = None,
    ) -> None:
        """Wait until ``GET http://127.0.0.1:<port><path>`` on the machine answers 200.

        Through ``host_address`` the host asks itself: under TCG a ``curl`` in the guest costs
        about half a second of the guest's CPU per probe, taken from the server that is starting
        (docs/ci-time.md). Without one, ``curl`` runs on the machine. A timeout shows the last
        answer, and ``unit``'s status and journal when given.
        """
        __tracebackhide__ = True
        url = f"http://127.0.0.1:{port}{path}"
        address = self.host_address(port)
        if address is None:
            try:
                self.wait_until_succeeds("curl -sf -m 5 %s", url, timeout=timeout)
            except WaitTimeout as error:
                raise WaitTimeout(
                    error.awaited, error.timeout, self._with_unit(error.last_seen, unit)
                ) from None
            return
        host, host_port = address
        last = ["(no answer yet)"]

        def attempt() -> bool:
            status, last[0] = http_status(host, host_port, path)
            return status == 200

        deadline = time.monotonic() + timeout
        with log.nested(
            f"waiting until {url} on {self.name} answers 200 (from {host}:{host_port})"
        ):
            self._poll(
                attempt,
                deadline,
                f"{url} on {self.name} to answer 200 (asked from {host}:{host_port})",
                lambda: self._with_unit(f"last answer: {last[0]}", unit),
                backoff=False,
            )

    def _with_unit(self, seen: str, unit: str | None) -> str:
        return f"{seen}\n{self.unit_diagnostics(unit)}" if unit else seen

    def wait_for_open_port(
        self, port: int, address: str = "127.0.0.1", timeout: float = DEFAULT_WAIT_TIMEOUT
    ) -> None:
        """Wait until ``address:port`` on the machine accepts TCP connections."""
        __tracebackhide__ = True
        probe = tcp_probe(address, port)
        with log.nested(f"waiting for port {address}:{port}"):
            self._poll(
                lambda: self.execute(probe, timeout=10).rc == 0,
                time.monotonic() + timeout,
                f"port {address}:{port} to accept connections",
                lambda: self.execute(LISTENING_TCP, timeout=10).stdout_text,
            )

    def journal(self, unit: str | None = None, boot: str = "0", lines: int | None = None) -> str:
        """Return journal lines of ``boot`` (default: the current boot), optionally of one unit."""
        words = ["journalctl", "--no-pager", "-o", "short-iso", "-b", boot]
        if unit is not None:
            words += ["-u", unit]
        if lines is not None:
            words += ["-n", str(int(lines))]
        return self.succeed("%s", words)

    def boot_id(self) -> str:
        """Return the kernel's boot ID of the running boot."""
        return self.succeed("cat /proc/sys/kernel/random/boot_id").strip()

    def reboot(self, timeout: float = DEFAULT_REBOOT_TIMEOUT) -> str:
        """Reboot, wait until the machine answers again, and prove a new boot began.

        Returns the new boot ID. Raises ``WaitTimeout`` if no boot answers in time and
        ``DriverError`` if the same boot answers again.
        """
        old = self.boot_id()
        with log.nested(f"rebooting {self.name} (boot {old})"), self._observed("reboot", []):
            self._issue_reboot()
            deadline = time.monotonic() + timeout
            self._wait_until_answering(deadline)
            new = self.boot_id()
            if new == old:
                raise DriverError(
                    f"{self.name}: reboot issued but the same boot {old} answered; "
                    "the machine did not reboot"
                )
            log.info(f"new boot {new}")
        return new

    def unit_diagnostics(self, unit: str) -> str:
        """``systemctl status`` and the last journal lines of ``unit`` in this boot."""
        status = self.execute("systemctl status --no-pager -l %s", unit, timeout=30)
        journal = self.execute(
            "journalctl --no-pager -b 0 -u %s -n %s", unit, JOURNAL_TAIL_LINES, timeout=30
        )
        return (
            f"--- systemctl status {unit} ---\n{status.stdout_text.rstrip()}\n"
            f"--- journal (last {JOURNAL_TAIL_LINES} lines, this boot) ---\n"
            f"{journal.stdout_text.rstrip()}"
        )

    def _poll(
        self,
        attempt: Callable[[], bool],
        deadline: float,
        awaited: str,
        last_seen: Callable[[], str],
        *,
        backoff: bool = True,
    ) -> None:
        """Call ``attempt`` until it returns True; past ``deadline`` raise ``WaitTimeout``.

        Tries are ``RETRY_INTERVAL`` apart, growing by half each time up to
        ``MAX_RETRY_INTERVAL`` with ``backoff``; the last try is made at the deadline.
        """
        __tracebackhide__ = True
        start = time.monotonic()
        interval = RETRY_INTERVAL
        while True:
            if attempt():
                return
            now = time.monotonic()
            if now >= deadline:
                raise WaitTimeout(awaited, now - start, last_seen())
            time.sleep(min(interval, deadline - now))
            if backoff:
                interval = min(interval * 1.5, MAX_RETRY_INTERVAL)

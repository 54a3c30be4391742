"""When ``wait_for_unit`` decides a unit will never start, on a scripted machine (no VM): only an
inactive unit without a job, on a manager with no job that is not booting, ends the wait."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vmtests.driver import machine as machine_module
from vmtests.driver.errors import UnitWillNotStart, WaitTimeout
from vmtests.driver.machine import CommandResult, Machine

UNIT = "demo.service"


class SystemdScript(Machine):
    """Answers the unit waits' ``systemctl show`` calls from a list of states, one per poll.

    Each state is ``(unit_lines, manager_lines)``; a poll that reads the manager reads the unit
    again from the same state. Status and journal answer with a fixed text.
    """

    name = "scripted-systemd"

    def __init__(self, states: list[tuple[str, str]]) -> None:
        self.states: Iterator[tuple[str, str]] = iter(states)
        self.current = ("", "")
        self.commands: list[str] = []

    def _run(self, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        if command.startswith("systemctl show -p NJobs"):
            unit_lines, manager_lines = self.current
            separator = machine_module.SHOW_SEPARATOR
            out = f"{manager_lines}\n{separator}\n{unit_lines}\n"
        elif command.startswith("systemctl show -p ActiveState,Job"):
            self.current = next(self.states, self.current)
            out = self.current[0] + "\n"
        else:
            out = "status-and-journal\n"
        return CommandResult(command, 0, out.encode(), b"")

    def _start(self) -> None: ...
    def _shutdown(self, timeout: float) -> None: ...
    def _crash(self) -> None: ...
    def _close(self) -> None: ...
    def _issue_reboot(self) -> None: ...
    def _wait_until_answering(self, deadline: float) -> None: ...


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls without waiting: the script, not the clock, decides."""
    monkeypatch.setattr(machine_module, "RETRY_INTERVAL", 0.0)


IDLE = "NJobs=0\nSystemState=running"
INACTIVE = "ActiveState=inactive"


def test_an_abandoned_unit_ends_the_wait_on_the_poll_that_sees_it() -> None:
    machine = SystemdScript([(INACTIVE, IDLE)])
    with pytest.raises(UnitWillNotStart) as caught:
        machine.wait_for_unit(UNIT, timeout=60)
    assert caught.value.state == "inactive"
    assert "SystemState=running" in str(caught.value)
    assert "status-and-journal" in caught.value.diagnostics


@pytest.mark.parametrize(
    ("unit_lines", "manager_lines"),
    [
        ("ActiveState=inactive\nJob=42", IDLE),  # queued: its own start job
        (INACTIVE, "NJobs=3\nSystemState=running"),  # another unit's job may start it
        (INACTIVE, "NJobs=0\nSystemState=starting"),  # the boot is still under way
        (INACTIVE, "NJobs=0\nSystemState=initializing"),
        ("ActiveState=activating\nJob=42", IDLE),
    ],
    ids=["own-job", "other-jobs", "booting", "initializing", "activating"],
)
def test_a_unit_that_may_still_start_is_waited_for(unit_lines: str, manager_lines: str) -> None:
    machine = SystemdScript([(unit_lines, manager_lines)] * 3 + [("ActiveState=active", IDLE)])
    machine.wait_for_unit(UNIT, timeout=60)
    reads = [c for c in machine.commands if c.startswith("systemctl show -p ActiveState,Job")]
    assert len(reads) == 4


def test_the_unit_is_read_again_after_the_manager() -> None:
    # Jobless at the first read, but started by the time the manager is asked: not abandoned.
    machine = SystemdScript([(INACTIVE, IDLE), ("ActiveState=active", IDLE)])

    def run(command: str, timeout: float) -> CommandResult:
        if command.startswith("systemctl show -p NJobs"):
            separator = machine_module.SHOW_SEPARATOR
            out = f"{IDLE}\n{separator}\nActiveState=activating\nJob=7\n"
            machine.commands.append(command)
            return CommandResult(command, 0, out.encode(), b"")
        return SystemdScript._run(machine, command, timeout)

    machine._run = run  # type: ignore[method-assign]
    machine.wait_for_unit(UNIT, timeout=60)


def test_a_unit_never_active_nor_abandoned_times_out() -> None:
    machine = SystemdScript([("ActiveState=inactive\nJob=42", IDLE)])
    with pytest.raises(WaitTimeout) as caught:
        machine.wait_for_unit(UNIT, timeout=0)
    assert f"unit {UNIT} to become active" in str(caught.value)
    assert "ActiveState=inactive" in caught.value.last_seen

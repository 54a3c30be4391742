"""The SSH backend's session bookkeeping, without a host: what a reconnect waits for after a
reboot whose wait a Ctrl-C cut short (the backend against a guest is test_driver_ssh.py)."""

from __future__ import annotations

import time

import pytest

from vmtests.driver.errors import CommandFailed, WaitTimeout
from vmtests.driver.machine import CommandResult, Reconnecting
from vmtests.driver.ssh import SshMachine

OLD_BOOT = "0d6f-old-boot"


def _host(
    monkeypatch: pytest.MonkeyPatch, reboot_rc: int = 0
) -> tuple[SshMachine, list[tuple[float, str | None]]]:
    """An ``SshMachine`` whose commands answer without ssh (the reboot request with
    ``reboot_rc``), and the ``(seconds left, boot to skip)`` of each connection it opens."""
    machine = SshMachine("cfx-llm2", start_timeout=120)
    connections: list[tuple[float, str | None]] = []

    def execute(command: str, *args: object, timeout: float) -> CommandResult:
        return CommandResult(command, reboot_rc, b"", b"")

    def connect(deadline: float, not_boot_id: str | None = None) -> None:
        connections.append((deadline - time.monotonic(), not_boot_id))

    monkeypatch.setattr(machine, "boot_id", lambda: OLD_BOOT)
    monkeypatch.setattr(machine, "execute", execute)
    monkeypatch.setattr(machine, "_connect", connect)
    return machine, connections


def _interrupted(deadline: float) -> None:
    raise KeyboardInterrupt


def test_a_reconnect_after_an_interrupted_reboot_waits_for_a_new_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, connections = _host(monkeypatch)
    assert isinstance(machine, Reconnecting)
    monkeypatch.setattr(machine, "_wait_session_end", _interrupted)
    with pytest.raises(KeyboardInterrupt):
        machine.reboot(timeout=900)
    assert machine.reboot_pending
    machine.reconnect(900.0)
    ((left, skipped),) = connections
    assert skipped == OLD_BOOT  # the old boot, still going down, does not count
    assert 890 < left <= 900
    assert not machine.reboot_pending
    machine.reconnect()  # no reboot pending: any boot, within start_timeout
    assert connections[1][1] is None
    assert 110 < connections[1][0] <= 120


def test_a_refused_reboot_request_leaves_no_reboot_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, _ = _host(monkeypatch, reboot_rc=1)
    with pytest.raises(CommandFailed):
        machine.reboot(timeout=900)
    assert not machine.reboot_pending


def test_a_host_that_never_went_down_leaves_no_reboot_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old session stayed open the whole ``reboot_timeout``: the host did not reboot, so a
    rollback must run on the boot that still answers, not wait for a new one that never
    comes."""
    machine, connections = _host(monkeypatch)

    def stayed_open(deadline: float) -> None:
        raise WaitTimeout("the ssh session to cfx-llm2 to end", 900.0, "the session stayed open")

    monkeypatch.setattr(machine, "_wait_session_end", stayed_open)
    with pytest.raises(WaitTimeout):
        machine.reboot(timeout=900)
    assert not machine.reboot_pending
    machine.reconnect()
    ((left, skipped),) = connections
    assert skipped is None  # any boot: the one that answered all along
    assert 110 < left <= 120

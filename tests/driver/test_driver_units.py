"""Unit and port waits: a failing unit raises at once with diagnostics; active units pass."""

from __future__ import annotations

import shlex

import pytest

from vmtests.driver.errors import DriverError, WaitTimeout
from vmtests.driver.qemu import QemuMachine

pytestmark = pytest.mark.vm

# A oneshot goes from activating straight to failed: it is never "active", so the wait cannot
# end early on a slow guest that shows a simple service as active for a moment before it exits.
FAILING_UNIT = """[Unit]
Description=vmtests deliberately failing unit
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo vmtests-failing-unit-says-goodbye; exit 3'
"""


def test_wait_for_unit_raises_at_once_on_failed_with_diagnostics(
    shared_guest: QemuMachine,
) -> None:
    shared_guest.succeed(
        f"printf '%s' {shlex.quote(FAILING_UNIT)} > /run/systemd/system/vmt-failing.service && "
        "systemctl daemon-reload && systemctl reset-failed vmt-failing.service 2>/dev/null;"
        "systemctl start --no-block vmt-failing.service"
    )
    with pytest.raises(DriverError) as caught:
        # A generous timeout: "at once" means the failed state ends the wait, not the clock.
        shared_guest.wait_for_unit("vmt-failing.service", timeout=240)
    assert not isinstance(caught.value, WaitTimeout)
    message = str(caught.value)
    assert "entered state 'failed'" in message
    assert "systemctl status vmt-failing.service" in message
    assert "status=3" in message  # from systemctl status
    assert "vmtests-failing-unit-says-goodbye" in message  # from the unit's journal
    shared_guest.succeed(
        "rm -f /run/systemd/system/vmt-failing.service; systemctl daemon-reload;"
        " systemctl reset-failed"
    )


def test_wait_for_unit_and_port_pass_for_sshd(shared_guest: QemuMachine) -> None:
    shared_guest.wait_for_unit("ssh.service", timeout=120)
    shared_guest.wait_for_open_port(22, timeout=60)


def test_wait_for_open_port_times_out_with_listening_sockets(shared_guest: QemuMachine) -> None:
    with pytest.raises(WaitTimeout) as caught:
        shared_guest.wait_for_open_port(1, timeout=3)
    assert "port 127.0.0.1:1" in str(caught.value)
    assert ":22" in caught.value.last_seen  # `ss -ltnp` output shows what does listen

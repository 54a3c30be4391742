"""Unit and port waits: a failed unit, or an inactive one nothing will start, ends the wait at
once with diagnostics; a unit queued behind a slow one is waited for; active units pass."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator

import pytest

from vmtests.driver.errors import CommandFailed, DriverError, UnitWillNotStart, WaitTimeout
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


# Oneshots that stay active once run: "active" is reached only when the unit really ran.
IDLE_UNIT = """[Unit]
Description=vmtests unit that nothing starts
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
"""
SLOW_UNIT = """[Unit]
Description=vmtests unit that takes 5 s to start
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=/bin/sleep 5
ExecStart=/bin/true
"""
QUEUED_UNIT = """[Unit]
Description=vmtests unit queued behind vmt-slow
Requires=vmt-slow.service
After=vmt-slow.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
"""
REFUSING_UNIT = """[Unit]
Description=vmtests unit that refuses a manual start
RefuseManualStart=yes
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
"""
TEST_UNITS = {
    "vmt-idle.service": IDLE_UNIT,
    "vmt-slow.service": SLOW_UNIT,
    "vmt-queued.service": QUEUED_UNIT,
    "vmt-refusing.service": REFUSING_UNIT,
}
FAIL_FAST_BOUND = 60.0
"""A fail-fast wait must end well before its 240 s timeout (a property, not a benchmark)."""


@pytest.fixture(scope="module")
def test_units(shared_reference_guest: QemuMachine) -> Iterator[QemuMachine]:
    """The shared guest with ``TEST_UNITS`` in /run/systemd/system, none started; removed after
    this module (a ``daemon-reload`` costs seconds under TCG; each test uses its own units)."""
    shared_guest = shared_reference_guest
    shared_guest.write_files({f"/run/systemd/system/{n}": t for n, t in TEST_UNITS.items()})
    shared_guest.succeed("systemctl daemon-reload")
    yield shared_guest
    shared_guest.succeed(
        "systemctl stop %s; rm -f %s; systemctl daemon-reload; systemctl reset-failed",
        list(TEST_UNITS),
        [f"/run/systemd/system/{name}" for name in TEST_UNITS],
    )


def test_wait_for_unit_stops_at_once_on_a_unit_nothing_starts(test_units: QemuMachine) -> None:
    start = time.monotonic()
    with pytest.raises(UnitWillNotStart) as caught:
        test_units.wait_for_unit("vmt-idle.service", timeout=240)
    elapsed = time.monotonic() - start
    assert isinstance(caught.value, DriverError)
    assert not isinstance(caught.value, WaitTimeout)
    assert elapsed < FAIL_FAST_BOUND, f"the wait took {elapsed:.1f} s of its 240 s"
    assert caught.value.state == "inactive"
    message = str(caught.value)
    assert "'inactive' with no job queued" in message
    assert "--- systemctl status vmt-idle.service ---" in message
    assert "Loaded: loaded (/run/systemd/system/vmt-idle.service" in message


def test_wait_for_unit_waits_for_a_unit_queued_behind_a_slow_one(test_units: QemuMachine) -> None:
    queued = test_units.succeed(
        "systemctl start --no-block vmt-queued.service && "
        "systemctl show -p ActiveState,Job vmt-queued.service"
    )
    # The case a "no job" test must not mistake for abandoned: inactive, with a start job.
    assert "ActiveState=inactive" in queued
    assert "Job=" in queued
    test_units.wait_for_unit("vmt-queued.service", timeout=120)
    assert test_units.succeed("systemctl is-active vmt-slow.service").strip() == "active"


def test_a_refused_start_fails_and_so_does_the_wait_at_once(test_units: QemuMachine) -> None:
    refused = test_units.start_job("vmt-refusing.service")
    assert refused.rc != 0
    assert "refuse" in refused.stderr_text.lower()
    with pytest.raises(CommandFailed):
        test_units.succeed("systemctl start vmt-refusing.service")
    start = time.monotonic()
    with pytest.raises(UnitWillNotStart):
        test_units.wait_for_unit("vmt-refusing.service", timeout=240)
    assert time.monotonic() - start < FAIL_FAST_BOUND

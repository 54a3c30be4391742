"""Reboot over the backdoor and over ssh: a new boot, persistent disk, per-boot journal/console."""

from __future__ import annotations

import secrets

import pytest

from vmtests.driver.errors import WaitTimeout
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine

pytestmark = pytest.mark.vm


def _reboot_and_check_persistence(machine: Machine) -> tuple[str, str, str]:
    """Write a file and a journal mark, reboot, and check both against the new boot.

    Returns (old boot id, new boot id, the mark). Shared by both backends: the same proof.
    """
    mark = f"vmtests-mark-{secrets.token_hex(6)}"
    machine.succeed(f"echo {mark} > /root/survivor && sync && logger -t vmtests {mark}")
    old = machine.boot_id()
    assert mark in machine.journal()  # the current boot's journal has it before the reboot
    new = machine.reboot(timeout=300)
    assert new != old
    assert machine.boot_id() == new
    assert machine.succeed("cat /root/survivor").strip() == mark
    assert mark not in machine.journal()  # boot 0 is the new boot
    assert mark in machine.journal(boot="-1")  # persistent journald kept the old boot
    boots = machine.succeed("journalctl --list-boots --no-pager")
    assert old.replace("-", "") in boots
    assert new.replace("-", "") in boots
    return old, new, mark


def test_backdoor_reboot_new_boot_persistent_disk_and_per_boot_console(
    shared_guest: QemuMachine,
) -> None:
    console_mark = f"vmtests-console-{secrets.token_hex(6)}"
    shared_guest.succeed(f"echo {console_mark} > /dev/ttyS0")
    shared_guest.wait_for_console_text(console_mark, timeout=30)
    boot_before = shared_guest.boot_index

    _reboot_and_check_persistence(shared_guest)

    assert shared_guest.boot_index == boot_before + 1
    assert console_mark in shared_guest.console_text(boot_before)
    assert console_mark not in shared_guest.console_text()
    assert console_mark in shared_guest.console_log(boot_before).read_text(errors="replace")
    # The text is in the capture, but only in the old boot: a wait must not see it.
    with pytest.raises(WaitTimeout) as caught:
        shared_guest.wait_for_console_text(console_mark, timeout=3)
    assert f"boot {shared_guest.boot_index}" in str(caught.value)
    fresh = f"vmtests-console-{secrets.token_hex(6)}"
    shared_guest.succeed(f"echo {fresh} > /dev/ttyS0")
    assert shared_guest.wait_for_console_text(fresh, timeout=30) == fresh


@pytest.mark.nightly
def test_ssh_backend_passes_the_same_reboot_test(
    shared_guest: QemuMachine, guest_ssh: SshMachine
) -> None:
    old, new, mark = _reboot_and_check_persistence(guest_ssh)
    # The backdoor of the same guest must agree: same disk, same new boot.
    assert shared_guest.wait_for_new_boot(old, timeout=120) == new
    assert shared_guest.boot_id() == new
    assert shared_guest.succeed("cat /root/survivor").strip() == mark

"""Fixtures of the driver integration tests: the shared reference guest, an ssh session to it.

Booting a guest under TCG costs tens of seconds (docs/ci-time.md), so the framing, unit,
console, reboot and ssh tests share the plugin's ``shared_reference_guest``; each leaves it
running and answering.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine
from vmtests.guest.access import ssh_to_guest


@pytest.fixture
def shared_guest(shared_reference_guest: QemuMachine) -> QemuMachine:
    """The session's shared reference guest (the plugin's ``shared_reference_guest``)."""
    return shared_reference_guest


@pytest.fixture
def guest_ssh(shared_guest: QemuMachine, tmp_path: Path) -> Iterator[SshMachine]:
    """An ssh session to the shared guest, host key pinned from the guest's own keys."""
    machine = ssh_to_guest(shared_guest, tmp_path / "ssh")
    machine.start()
    try:
        yield machine
    finally:
        machine.close()

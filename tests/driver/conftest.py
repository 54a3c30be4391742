"""Fixtures of the driver integration tests: one shared reference guest, process scanning.

Booting a guest under TCG costs ~15-25 s, so the framing, unit, console, reboot and ssh tests
share one guest; each of them leaves it running and answering, so they stay independent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine
from vmtests.guest.access import ssh_to_guest
from vmtests.guest.image import ReferenceImage, start_reference_guest


@pytest.fixture(scope="session")
def shared_guest(
    reference_image: ReferenceImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QemuMachine]:
    """A reference guest shared by the driver tests (TCG unless VMTESTS_ACCEL says otherwise)."""
    guest = start_reference_guest(
        tmp_path_factory.mktemp("shared-guest"), name="shared", image=reference_image
    )
    try:
        yield guest
    finally:
        guest.close()


@pytest.fixture
def guest_ssh(shared_guest: QemuMachine, tmp_path: Path) -> Iterator[SshMachine]:
    """An ssh session to the shared guest, host key pinned from the guest's own keys."""
    machine = ssh_to_guest(shared_guest, tmp_path / "ssh")
    machine.start()
    try:
        yield machine
    finally:
        machine.close()

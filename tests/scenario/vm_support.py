"""A reference guest for the scenario's VM tests, always closed, even on failure or Ctrl-C."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vmtests.driver.qemu import QemuMachine
from vmtests.guest.targets import machine_from_target

REFERENCE_TARGET = "qemu:reference"


@contextmanager
def reference_machine(state_dir: Path, name: str = "reference") -> Iterator[QemuMachine]:
    """A not-yet-started reference guest with the contract's memory and vCPUs."""
    machine = machine_from_target(REFERENCE_TARGET, state_dir, name=name)
    assert isinstance(machine, QemuMachine)
    try:
        yield machine
    finally:
        machine.close()

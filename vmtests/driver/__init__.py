"""The Machine API shared by the VM tier (QEMU) and the hardware tier (SSH)."""

from vmtests.driver.errors import CommandFailed, DriverError, MachineGone, WaitTimeout
from vmtests.driver.machine import CommandResult, Machine

__all__ = [
    "CommandFailed",
    "CommandResult",
    "DriverError",
    "Machine",
    "MachineGone",
    "WaitTimeout",
]

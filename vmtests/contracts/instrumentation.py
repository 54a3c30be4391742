"""The instrumentation contract between the host driver and every guest it drives.

Written once, in ``instrumentation.json`` next to this module, and exposed here. The reference
guest builder (``vmtests/guest/image.py``) renders its units from these values,
``modules/test-instrumentation.nix`` implements the same contract for NixOS test VMs from the
same JSON (``tests/driver/test_driver_contract.py`` checks that both render the same
backdoor), and the QEMU backend (``vmtests/driver/qemu.py``) relies on it. See
``docs/instrumentation.md``.

The contract:

- the kernel console is the first serial port ``ttyS0``; the host captures it per boot. Every
  boot starts with the kernel's ``Linux version`` line at timestamp 0, which is how the host
  splits the capture into boots;
- a root shell (the *backdoor*) reads commands from the named virtio serial port
  ``BACKDOOR_PORT_NAME`` (``/dev/virtio-ports/vmtests.backdoor``), prints
  ``BACKDOOR_READY_PREFIX boot_id=<id>`` once it is ready and then runs ``sh`` on it. The
  shell's own stderr goes to ``ttyS0`` so that it never corrupts the command channel.
  Why a ``virtserialport`` and not the ``virtconsole`` (``hvc0``) the nixpkgs driver uses:
  QEMU flow-controls serial ports, but *drops* console output whenever the host socket is
  momentarily full (``hw/char/virtio-console.c``, ``flush_buf``: only ``!is_console`` ports
  are throttled); 1 MiB outputs over ``hvc0`` lost whole blocks (docs/ci-time.md). A port is also
  not a tty, so there is no echo, line discipline or line-length limit to switch off;
- no getty runs on ``hvc0`` or ``ttyS0`` (a getty on the same device makes writes fail);
- sshd runs and accepts the suite's key for root;
- journald stores the journal persistently (``Storage=persistent``), so earlier boots can be
  read after a reboot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CONTRACT_FILE = Path(__file__).with_name("instrumentation.json")
"""The contract's data; ``modules/test-instrumentation.nix`` reads the same file."""

_DATA: dict[str, Any] = json.loads(CONTRACT_FILE.read_text())

SERIAL_DEVICE: str = _DATA["serialDevice"]
"""Kernel console; the host captures it to a per-boot log."""

BACKDOOR_PORT_NAME: str = _DATA["backdoorPortName"]
"""Name of the virtio serial port carrying the root backdoor shell (QEMU ``name=``)."""

BACKDOOR_DEVICE = f"/dev/virtio-ports/{BACKDOOR_PORT_NAME}"
"""The backdoor port as the guest sees it (udev's by-name symlink)."""

BACKDOOR_READY_PREFIX: str = _DATA["backdoorReadyPrefix"]
"""The backdoor prints ``<prefix> boot_id=<uuid>`` when its shell is about to start."""

BACKDOOR_READY_RE = re.compile(
    re.escape(BACKDOOR_READY_PREFIX).encode() + rb" boot_id=([0-9a-f-]{36})\r?\n"
)
"""Matches the ready line on the host side; group 1 is the boot ID of the boot that printed it."""

BOOT_MARKER_RE = re.compile(rb"\[\s*0\.000000\] Linux version ")
"""The first kernel line of every boot on the serial console: the per-boot split point."""

BACKDOOR_UNIT = "vmtests-backdoor.service"
"""Name of the backdoor unit, on the reference guest and in the NixOS module."""

JOURNAL_STORAGE: str = _DATA["journalStorage"]
"""journald ``Storage=`` value every guest uses."""

SSH_USER: str = _DATA["sshUser"]
"""The user the suite's ssh key logs in as."""

SSH_PORT = 22
"""The guest's sshd port (nixpkgs ``services.openssh.ports`` default; Debian's too)."""

MASKED_GETTYS: tuple[str, ...] = tuple(_DATA["maskedGettys"])
"""Getty units that must not run: they would fight the backdoor for the consoles."""


def backdoor_script(shell: str = "/bin/sh") -> str:
    """The backdoor program rendered from the contract's template (same text on NixOS).

    ``shell`` is the shell that then reads commands from the backdoor port.
    """
    text = "\n".join(_DATA["backdoorScript"]) + "\n"
    for key, value in (
        ("@backdoorDevice@", BACKDOOR_DEVICE),
        ("@serialDevice@", SERIAL_DEVICE),
        ("@readyPrefix@", BACKDOOR_READY_PREFIX),
        ("@shell@", shell),
    ):
        text = text.replace(key, value)
    return text


CONSOLE_LOG_LEVEL: int = int(_DATA["consoleLogLevel"])
"""Kernel ``loglevel=`` of every guest: the ``Linux version`` line (a notice, level 5) must reach
the serial console, which NixOS's default of 4 prevents (nixpkgs
``nixos/modules/system/boot/kernel.nix``)."""

KERNEL_PARAMS: tuple[str, ...] = (*_DATA["kernelParams"], f"loglevel={CONSOLE_LOG_LEVEL}")
"""Kernel parameters every guest boots with."""

GUEST_MEMORY_MB: int = int(_DATA["resources"]["memoryMB"])
"""Memory of every test guest, NixOS VM and reference guest alike."""

GUEST_CPUS: int = int(_DATA["resources"]["cpus"])
"""vCPUs of every test guest."""

HUGEPAGE_LOW_MEMORY_MB: int = int(_DATA["resources"]["hugepageLowMemoryMB"])
"""Guest RAM below 4 GiB, which never yields an aligned 1 GiB page (QEMU ``pc`` machine)."""

HUGEPAGE_HEADROOM_MB: int = int(_DATA["resources"]["hugepageHeadroomMB"])
"""Memory a guest needs besides its hugepages (``vmtests.guest.resources``)."""

GUEST_TOOLS: dict[str, str] = dict(_DATA["tools"])
"""Every program the suite runs inside a guest, mapped to the nixpkgs attribute providing it."""

"""The stubbed P150 device layer as seen from user space: device nodes and the driver file.

Shared by the stub server (refuses to start without the card) and the stub tt-smi. The stub
layer is installed by ``vmtests.guest.stub_layer`` (reference guest, hosts) and by
``modules/tenstorrent-stub.nix`` (NixOS VMs), both with the same tmpfiles rules below.

A real ``/dev/tenstorrent/N`` has tt-kmd's dynamic major. The stub node uses major
``STUB_MAJOR`` = 120, from a char range the kernel's ``Documentation/admin-guide/devices.txt``
lists for local/experimental use (120-127), so it never collides with a real driver; the
dynamic majors are handed out from 254 down (234-254, ``fs/char_dev.c``), where a number could
belong to any driver loaded at boot. No driver backs it (opening it fails with ENXIO): only
``stat`` and docker's ``--device`` use it, and both only need a character device.
"""

from __future__ import annotations

import os
import stat

from vmtests.contracts.serving import DEVICE
from vmtests.stub import knobs

STUB_MAJOR = 120
STUB_DRIVER_VERSION = "2.10.0"
DEVICE_DIR = os.path.dirname(DEVICE)


def tmpfiles_rules(driver_file: str = knobs.DEFAULT_DRIVER_FILE) -> list[str]:
    """systemd-tmpfiles lines creating the device node, the driver version file and the knobs file.

    ``/dev`` lines are applied by systemd-tmpfiles-setup-dev.service at every boot (``/dev`` is
    a fresh devtmpfs each boot); the driver file lives in ``/run`` for the same reason sysfs
    is volatile: it exists only while the "driver" is loaded.
    """
    driver_dir = os.path.dirname(driver_file)
    return [
        f"d {DEVICE_DIR} 0755 root root -",
        f"c {DEVICE} 0666 root root - {STUB_MAJOR}:0",
        f"d {driver_dir} 0755 root root -",
        f"f+ {driver_file} 0444 root root - {STUB_DRIVER_VERSION}",
        # The knobs file the serving container reads (--env-file): created empty (faults off)
        # when missing, never overwritten, so knobs a test sets survive a reboot on both guests.
        f"d {os.path.dirname(knobs.KNOBS_FILE)} 0755 root root -",
        f"f {knobs.KNOBS_FILE} 0644 root root -",
    ]


def device_problem(path: str) -> str | None:
    """Why ``path`` is not a usable device node, or None when it is a character device."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as error:
        return f"{path} cannot be inspected: {error.strerror}"
    if not stat.S_ISCHR(mode):
        return f"{path} is not a character device"
    return None


def usable_devices(env: knobs.Environ) -> list[str]:
    """The required device nodes that are character devices."""
    return [path for path in knobs.device_paths(env) if device_problem(path) is None]


def driver_version(env: knobs.Environ) -> str | None:
    """The stub driver's version from its version file, or None when no driver is "loaded"."""
    try:
        with open(knobs.driver_file(env), encoding="utf-8") as handle:
            version = handle.read().strip()
    except OSError:
        return None
    return version or None

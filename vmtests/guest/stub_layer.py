"""Install the stub P150 device layer into any ``Machine`` (the reference guest or a host).

``install_stub_device_layer(machine)`` leaves the machine with:

- the stub's part of the ``vmtests`` package (``stub_image.copy_package``: what
  ``modules/tenstorrent-stub.nix`` and the stub image carry too) under ``/opt/vmtests/vmtests``
  (``features.json`` copied as a real file, not a symlink), so
  ``PYTHONPATH=/opt/vmtests python3 -m vmtests.stub.server`` runs;
- ``/usr/local/bin/tt-smi`` (the stub tt-smi) and ``/usr/local/bin/vmtests-stub-server``;
- ``/etc/tmpfiles.d/tenstorrent-stub.conf`` creating ``/dev/tenstorrent/0`` (char device, mode
  0666, major ``device.STUB_MAJOR``) and the stub driver version file, applied now and by
  systemd-tmpfiles at every boot.

It is idempotent: running it again replaces the package and rewrites the same files. This is the
same layer ``modules/tenstorrent-stub.nix`` declares for NixOS VMs (same tmpfiles rules).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vmtests.contracts.serving import DEVICE
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest import toolpath
from vmtests.guest.stub_image import copy_package
from vmtests.stub import device, knobs

GUEST_PYTHONPATH = "/opt/vmtests"
GUEST_PACKAGE = f"{GUEST_PYTHONPATH}/vmtests"
TT_SMI_PATH = toolpath.DEVICE_LAYER_PROGRAMS["tt-smi"]
SERVER_PATH = "/usr/local/bin/vmtests-stub-server"
TMPFILES_CONF = "/etc/tmpfiles.d/tenstorrent-stub.conf"


def wrapper_script(module: str) -> str:
    """A shell wrapper running ``python3 -m module`` from the installed package."""
    return (
        "#!/bin/sh\n"
        "# Installed by vmtests.guest.stub_layer: the stubbed P150 device layer.\n"
        f"PYTHONPATH={GUEST_PYTHONPATH}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        f'exec python3 -m {module} "$@"\n'
    )


def tmpfiles_conf() -> str:
    """The tmpfiles.d file content (rules from ``device.tmpfiles_rules``)."""
    header = "# Stub Tenstorrent P150 device layer (vmtests); see vmtests/stub/device.py\n"
    return header + "\n".join(device.tmpfiles_rules()) + "\n"


def layer_files() -> dict[str, str]:
    """The layer's programs and tmpfiles rules: ``{path on the machine: text}``."""
    return {
        TT_SMI_PATH: wrapper_script("vmtests.stub.tt_smi"),
        SERVER_PATH: wrapper_script("vmtests.stub.server"),
        TMPFILES_CONF: tmpfiles_conf(),
    }


def install_stub_device_layer(machine: Machine) -> None:
    """Install the stub device layer into ``machine`` and apply it now; idempotent.

    Raises ``CommandFailed`` when a step fails, including the final check that the device node
    is a character device and ``tt-smi -s`` succeeds. Few commands: under TCG each round trip
    costs guest CPU (docs/ci-time.md).
    """
    with log.nested(f"installing the stub P150 device layer on {machine.name}"):
        incoming = f"{GUEST_PACKAGE}.incoming"
        with tempfile.TemporaryDirectory(prefix="vmtests-stub-") as tmp:
            package = copy_package(Path(tmp))
            machine.succeed("rm -rf %s", incoming)
            machine.copy_to(package, incoming)
        machine.write_files(layer_files())
        # Apply the rules now (device node, driver file, knobs file); at boot
        # systemd-tmpfiles-setup(-dev).service applies them.
        machine.succeed(
            "rm -rf %s && mv %s %s && chmod 0755 %s && chmod 0644 %s && "
            "systemd-tmpfiles --create %s",
            GUEST_PACKAGE,
            incoming,
            GUEST_PACKAGE,
            [TT_SMI_PATH, SERVER_PATH],
            TMPFILES_CONF,
            TMPFILES_CONF,
        )
        check_stub_device_layer(machine)


def set_stub_knobs(machine: Machine, **knob_values: str) -> None:
    """Set the stub's knobs for the serving container (``knobs.KNOBS_FILE``); none: faults off.

    They take effect at the next start of the serving unit (the container reads the file then).
    """
    text = "".join(f"{name}={value}\n" for name, value in knob_values.items())
    unknown = [name for name in knob_values if not name.startswith(knobs.PREFIX)]
    if unknown:
        raise ValueError(f"not stub knobs (see vmtests/stub/knobs.py): {unknown}")
    machine.write_file(knobs.KNOBS_FILE, text)


def check_stub_device_layer(machine: Machine) -> str:
    """Check the layer works (char device, driver file, ``tt-smi -s``); return the snapshot."""
    machine.succeed("test -c %s && test -s %s", DEVICE, knobs.DEFAULT_DRIVER_FILE)
    return machine.succeed(f"{TT_SMI_PATH} -s")

"""Install the stub P150 device layer into any ``Machine`` (the reference guest or a host).

``install_stub_device_layer(machine)`` leaves the machine with:

- the ``vmtests`` package under ``/opt/vmtests/vmtests`` (``features.json`` copied as a real file,
  not a symlink), so ``PYTHONPATH=/opt/vmtests python3 -m vmtests.stub.server`` runs;
- ``/usr/local/bin/tt-smi`` (the stub tt-smi) and ``/usr/local/bin/vmtests-stub-server``;
- ``/etc/tmpfiles.d/tenstorrent-stub.conf`` creating ``/dev/tenstorrent/0`` (char device, mode
  0666, major ``device.STUB_MAJOR``) and the stub driver version file, applied now and by
  systemd-tmpfiles at every boot.

It is idempotent: running it again replaces the package and rewrites the same files. This is the
same layer ``modules/tenstorrent-stub.nix`` declares for NixOS VMs (same tmpfiles rules).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest import toolpath
from vmtests.stub import device, knobs

GUEST_PYTHONPATH = "/opt/vmtests"
GUEST_PACKAGE = f"{GUEST_PYTHONPATH}/vmtests"
TT_SMI_PATH = toolpath.DEVICE_LAYER_PROGRAMS["tt-smi"]
SERVER_PATH = "/usr/local/bin/vmtests-stub-server"
TMPFILES_CONF = "/etc/tmpfiles.d/tenstorrent-stub.conf"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


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


def stage_package(target: Path) -> Path:
    """Copy the local ``vmtests`` package to ``target/vmtests``, resolving symlinks."""
    staged = target / "vmtests"
    # symlinks=False copies the symlink's target: features.json becomes a regular file.
    shutil.copytree(
        PACKAGE_ROOT,
        staged,
        symlinks=False,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache"),
    )
    return staged


def _stage_files(target: Path) -> dict[str, Path]:
    files = {
        TT_SMI_PATH: wrapper_script("vmtests.stub.tt_smi"),
        SERVER_PATH: wrapper_script("vmtests.stub.server"),
        TMPFILES_CONF: tmpfiles_conf(),
    }
    staged: dict[str, Path] = {}
    for index, (destination, content) in enumerate(files.items()):
        path = target / f"file-{index}"
        path.write_text(content, encoding="utf-8")
        staged[destination] = path
    return staged


def install_stub_device_layer(machine: Machine) -> None:
    """Install the stub device layer into ``machine`` and apply it now; idempotent.

    Raises ``CommandFailed`` when a step fails, including the final check that the device node
    is a character device and ``tt-smi -s`` succeeds.
    """
    with log.nested(f"installing the stub P150 device layer on {machine.name}"):
        with tempfile.TemporaryDirectory(prefix="vmtests-stub-") as tmp:
            package = stage_package(Path(tmp))
            files = _stage_files(Path(tmp))
            incoming = f"{GUEST_PACKAGE}.incoming"
            machine.succeed("rm -rf %s", incoming)
            machine.copy_to(package, incoming)
            for destination, source in files.items():
                machine.copy_to(source, destination)
        machine.succeed("rm -rf %s && mv %s %s", GUEST_PACKAGE, incoming, GUEST_PACKAGE)
        machine.succeed("chmod 0755 %s && chmod 0644 %s", [TT_SMI_PATH, SERVER_PATH], TMPFILES_CONF)
        # Apply the rules now (device node, driver file, knobs file); at boot
        # systemd-tmpfiles-setup(-dev).service applies them.
        machine.succeed("systemd-tmpfiles --create %s", TMPFILES_CONF)
        check_stub_device_layer(machine)


def set_stub_knobs(machine: Machine, **knob_values: str) -> None:
    """Set the stub's knobs for the serving container (``knobs.KNOBS_FILE``); none: faults off.

    They take effect at the next start of the serving unit (the container reads the file then).
    """
    text = "".join(f"{name}={value}\n" for name, value in knob_values.items())
    unknown = [name for name in knob_values if not name.startswith("VMTESTS_STUB_")]
    if unknown:
        raise ValueError(f"not stub knobs (see vmtests/stub/knobs.py): {unknown}")
    machine.write_file(knobs.KNOBS_FILE, text)


def check_stub_device_layer(machine: Machine) -> str:
    """Check the layer works (char device, driver file, ``tt-smi -s``); return the snapshot."""
    machine.succeed("test -c %s && test -s %s", device.STUB_DEVICE, knobs.DEFAULT_DRIVER_FILE)
    return machine.succeed(f"{TT_SMI_PATH} -s")

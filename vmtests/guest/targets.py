"""Machine targets as strings, for the CLI and the pytest options.

- ``qemu:reference``: the Debian reference guest (built/cached on demand), booted under QEMU;
- ``qemu-nixos:<path>``: a NixOS VM started through its ``result/bin/run-<name>-vm`` script;
- ``ssh://[user@]host[:port]``: an existing host reached with the system ssh client.

``machine_from_target`` returns the machine *not started*; call ``start()`` (the scenario does).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vmtests.contracts.instrumentation import GUEST_CPUS, GUEST_MEMORY_MB
from vmtests.contracts.serving import SERVING_PORT
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine
from vmtests.guest import NIXOS_TARGET_PREFIX, REFERENCE_TARGET, SSH_TARGET_PREFIX, TARGET_FORMS

_SSH_RE = re.compile(
    r"^ssh://(?:(?P<user>[^@/]+)@)?(?P<host>\[[^\]]+\]|[^:/]+)(?::(?P<port>\d+))?/?$"
)

QEMU_OPTIONS = (
    "memory_mb",
    "cpus",
    "accel",
    "forward_ports",
    "boot_timeout",
    "name",
    "data_disks",
)
SSH_OPTIONS = (
    "identity_file",
    "known_hosts",
    "strict_host_key_checking",
    "sudo",
    "sudo_password",
    "connect_timeout",
)


class TargetError(ValueError):
    """The target string or its options are not valid."""


def parse_ssh_target(target: str) -> tuple[str | None, str, int]:
    """Split ``ssh://[user@]host[:port]`` into (user, host, port); port defaults to 22."""
    match = _SSH_RE.match(target)
    if match is None:
        raise TargetError(f"not an ssh target: {target!r} (expected ssh://[user@]host[:port])")
    host = match.group("host").strip("[]")
    return match.group("user"), host, int(match.group("port") or 22)


def _pick(options: dict[str, Any], allowed: tuple[str, ...], target: str) -> dict[str, Any]:
    """The options that apply to this kind of target; unknown ones are an error."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TargetError(f"options {unknown} do not apply to target {target!r}")
    return {key: value for key, value in options.items() if value is not None}


def machine_from_target(target: str, state_dir: Path, **options: Any) -> Machine:
    """Build the (not yet started) machine that ``target`` names.

    QEMU targets accept ``memory_mb``, ``cpus`` (the reference guest defaults to the
    contract's ``GUEST_MEMORY_MB``/``GUEST_CPUS``; a NixOS VM to its own configuration),
    ``accel``, ``forward_ports`` (default: the serving port 8000), ``boot_timeout`` and
    ``name``; ssh targets accept ``identity_file``, ``known_hosts``,
    ``strict_host_key_checking`` (default True), ``sudo``, ``sudo_password``
    and ``connect_timeout``.
    """
    state_dir = Path(state_dir)
    if target == REFERENCE_TARGET:
        from vmtests.guest.image import reference_image  # noqa: PLC0415
        from vmtests.guest.stub_image import DISK_SERIAL, stub_image  # noqa: PLC0415

        chosen = _pick(options, QEMU_OPTIONS, target)
        image = reference_image()
        # The stub serving image rides along on a read-only disk: the guest's "store".
        chosen.setdefault("data_disks", {DISK_SERIAL: stub_image().disk})
        chosen.setdefault("memory_mb", GUEST_MEMORY_MB)
        chosen.setdefault("cpus", GUEST_CPUS)
        return QemuMachine(
            name=chosen.pop("name", "reference"),
            state_dir=state_dir,
            kernel=image.kernel,
            initrd=image.initrd,
            append=image.append,
            base_disk=image.disk,
            ssh_key=image.ssh_key,
            forward_ports=tuple(chosen.pop("forward_ports", (SERVING_PORT,))),
            **chosen,
        )
    if target.startswith(NIXOS_TARGET_PREFIX):
        script = Path(target.removeprefix(NIXOS_TARGET_PREFIX)).expanduser()
        if not script.is_file():
            raise TargetError(f"{target}: no run-vm script at {script}")
        chosen = _pick(options, QEMU_OPTIONS, target)
        name = chosen.pop("name", None) or re.sub(r"^run-|-vm$", "", script.name) or "nixos"
        return QemuMachine(
            name=name,
            state_dir=state_dir,
            run_script=script.resolve(),
            forward_ports=tuple(chosen.pop("forward_ports", (SERVING_PORT,))),
            **chosen,
        )
    if target.startswith(SSH_TARGET_PREFIX):
        user, host, port = parse_ssh_target(target)
        chosen = _pick(options, SSH_OPTIONS, target)
        return SshMachine(host=host, port=port, user=user or "root", **chosen)
    raise TargetError(f"unknown target {target!r}: use {TARGET_FORMS}")

"""How a QEMU guest is launched: the command line and environment, for both kinds of guest.

- *direct* mode boots the reference guest: ``-kernel/-initrd/-append`` plus a qcow2 overlay on
  the base image;
- *nixos* mode runs the ``result/bin/run-<name>-vm`` script that nixpkgs' ``qemu-vm.nix``
  builds. That script ``exec``s QEMU with its own options, then ``$QEMU_OPTS``, then ``"$@"``;
  it creates ``$NIX_DISK_IMAGE`` on first use, puts ``$QEMU_NET_OPTS`` into its
  ``-netdev user,...`` option and keeps its scratch files in ``$TMPDIR`` when ``USE_TMPDIR=1``
  (the same variables the nixpkgs test driver sets). We pass our devices as arguments, like the
  nixpkgs driver does.

``no_reboot`` adds ``-no-reboot``: a guest reboot then ends QEMU after the guest's full
shutdown, and the backend starts a fresh QEMU on the same disk (its ``restart`` reboot mode).

Both modes share the instrumentation devices: ttyS0 and the backdoor port connect to host-side UNIX
sockets the driver listens on, and QMP listens on a third socket.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vmtests.contracts.instrumentation import BACKDOOR_PORT_NAME
from vmtests.contracts.settings import settings

QEMU_BINARY = settings().qemu
"""The QEMU binary (the ``qemu`` setting, read when the driver is imported)."""


@dataclass(frozen=True)
class Sockets:
    """Host-side UNIX socket paths of one QEMU run (kept short: sun_path has 108 bytes)."""

    serial: Path
    backdoor: Path
    qmp: Path


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one QEMU process."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def hostfwd(forwards: Mapping[int, int]) -> str:
    """``hostfwd=`` options for slirp: host 127.0.0.1:<host> -> guest :<guest>."""
    return ",".join(
        f"hostfwd=tcp:127.0.0.1:{host}-:{guest}" for guest, host in sorted(forwards.items())
    )


def instrumentation_args(sockets: Sockets, marker: str) -> list[str]:
    """QEMU arguments of the instrumentation contract: ttyS0, backdoor port, QMP, no display.

    ``marker`` goes into a ``-device`` id so that tests can find this QEMU in ``ps``.
    """
    return [
        "-display",
        "none",
        "-chardev",
        f"socket,id=vmtserial,path={sockets.serial}",
        "-serial",
        "chardev:vmtserial",
        "-chardev",
        f"socket,id=vmtshell,path={sockets.backdoor}",
        "-device",
        "virtio-serial",
        "-device",
        f"virtserialport,chardev=vmtshell,name={BACKDOOR_PORT_NAME}",
        "-qmp",
        f"unix:{sockets.qmp},server=on,wait=off",
        "-device",
        f"virtio-rng-pci,id={marker}",
        "-monitor",
        "none",
    ]


def tcg_thread_mode(cpus: int, host_cores: int, guests_at_once: int) -> str:
    """``multi`` (a host thread per vCPU, MTTCG) only when every vCPU of every guest running at
    once has a host core; otherwise ``single`` (one thread runs all of a guest's vCPUs).

    Under contention MTTCG's cross-vCPU synchronisation costs more than it gains, while a lone
    guest still gains from it (the figures are in docs/ci-time.md).
    """
    return "multi" if host_cores >= cpus * guests_at_once else "single"


GUESTS_AT_ONCE: list[int] = []
"""Guests this process runs at once, when it runs several (``guests_at_once``)."""


@contextmanager
def guests_at_once(count: int) -> Iterator[None]:
    """Within the block this process runs ``count`` guests at once (``host_tcg_thread_mode``)."""
    GUESTS_AT_ONCE.append(count)
    try:
        yield
    finally:
        GUESTS_AT_ONCE.pop()


def host_tcg_thread_mode(cpus: int) -> str:
    """``tcg_thread_mode`` for this host: the guests at once are those of ``guests_at_once``,
    else pytest-xdist's workers (each drives one guest at a time; xdist sets
    ``PYTEST_XDIST_WORKER_COUNT``), else one."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    guests = int(workers) if workers.isdigit() and int(workers) > 0 else 1
    if GUESTS_AT_ONCE:
        guests = GUESTS_AT_ONCE[-1]
    return tcg_thread_mode(cpus, os.cpu_count() or 1, guests)


def accel_args(accel: str, machine_option: bool = False, cpus: int = 1) -> list[str]:
    """Acceleration and CPU model.

    Under TCG ``-cpu max`` enables every feature TCG emulates, including ``pdpe1gb`` (1 GiB
    pages, needed for the 1 GiB hugepages of the serving scenario). Under KVM both ``host``
    and ``max`` abort on our machines (``failed to set MSR 0x10a``), so KVM gets the portable
    ``kvm64`` model plus ``pdpe1gb``. ``machine_option`` spells it as
    ``-machine accel=``: nixpkgs' ``qemu-kvm`` wrapper already passes ``-machine accel=kvm:tcg``,
    which QEMU refuses to combine with ``-accel`` but lets a later ``-machine`` override;
    ``-machine accel=`` cannot carry TCG's ``thread=``, so such a guest keeps QEMU's default.
    Elsewhere TCG gets ``host_tcg_thread_mode(cpus)``.
    """
    if accel not in ("kvm", "tcg"):
        raise ValueError(f"accel must be 'kvm' or 'tcg' at launch time, not {accel!r}")
    cpu = "max" if accel == "tcg" else "kvm64,+pdpe1gb"
    if machine_option:
        return ["-machine", f"accel={accel}", "-cpu", cpu]
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", cpu]
    return ["-accel", f"tcg,thread={host_tcg_thread_mode(cpus)}", "-cpu", cpu]


def direct_spec(
    *,
    kernel: Path,
    initrd: Path,
    append: str,
    overlay: Path,
    memory_mb: int,
    cpus: int,
    accel: str,
    forwards: Mapping[int, int],
    sockets: Sockets,
    marker: str,
    no_reboot: bool = False,
    data_disks: Mapping[str, Path] | None = None,
    incoming: str | None = None,
) -> LaunchSpec:
    """Command line of a directly booted guest (the reference guest).

    ``data_disks`` maps a serial (at most 20 characters) to a file attached read-only as a
    virtio disk; the guest sees it as ``/dev/disk/by-id/virtio-<serial>``. ``incoming`` is a
    migration URI to load the guest's memory and devices from instead of booting
    (``-incoming``, ``vmtests.driver.qemu_snapshot``).
    """
    disks: list[str] = []
    for index, (serial, path) in enumerate(sorted((data_disks or {}).items())):
        if len(serial) > 20:
            raise ValueError(f"virtio-blk serial {serial!r} is longer than 20 characters")
        disks += [
            "-drive",
            f"if=none,id=data{index},file={path},format=raw,readonly=on",
            "-device",
            # A high PCI slot: the guest enumerates it after the root disk, which stays vda.
            f"virtio-blk-pci,drive=data{index},serial={serial},addr={0x18 + index:#x}",
        ]
    argv = [
        QEMU_BINARY,
        "-name",
        marker,
        "-nodefaults",
        "-no-user-config",
        "-machine",
        "pc",
        *accel_args(accel, cpus=cpus),
        "-smp",
        str(cpus),
        "-m",
        str(memory_mb),
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        append,
        "-drive",
        f"file={overlay},if=virtio,format=qcow2,cache=writeback,werror=report",
        *disks,
        "-netdev",
        f"user,id=net0,{hostfwd(forwards)}",
        "-device",
        "virtio-net-pci,netdev=net0",
        *instrumentation_args(sockets, marker),
        *(["-no-reboot"] if no_reboot else []),
        *(["-incoming", incoming] if incoming else []),
    ]
    return LaunchSpec(argv=argv)


def nixos_spec(
    *,
    run_script: Path,
    state_dir: Path,
    disk_image: Path,
    memory_mb: int | None,
    cpus: int | None,
    accel: str,
    forwards: Mapping[int, int],
    sockets: Sockets,
    marker: str,
    no_reboot: bool = False,
    extra_args: Sequence[str] = (),
) -> LaunchSpec:
    """Command line and environment of a NixOS VM started through its ``run-*-vm`` script.

    The script already passes ``-m``/``-smp`` from the NixOS configuration; later options win
    in QEMU, so ``memory_mb``/``cpus`` override them only when given. The script's own
    ``-nographic`` (``virtualisation.graphics = false``) would put a monitor on stdio; our
    ``-display none -monitor none`` and explicit ``-serial`` come later and replace that.
    """
    scratch = state_dir / "nixos-tmp"
    shared = state_dir / "xchg-shared"
    scratch.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)
    args = [*accel_args(accel, machine_option=True), *instrumentation_args(sockets, marker)]
    if no_reboot:
        args.append("-no-reboot")
    if memory_mb is not None:
        args += ["-m", str(memory_mb)]
    if cpus is not None:
        args += ["-smp", str(cpus)]
    env = {
        "NIX_DISK_IMAGE": str(disk_image),
        # With useEFIBoot the script keeps the EFI variables in $NIX_EFI_VARS, by default
        # `<system name>-efi-vars.fd` in the current directory (nixpkgs
        # nixos/modules/virtualisation/qemu-vm.nix): keep them with the disk, so that a fresh
        # QEMU after a reboot boots the same entries and nothing lands in the caller's cwd.
        "NIX_EFI_VARS": str(state_dir / "efi-vars.fd"),
        "QEMU_NET_OPTS": hostfwd(forwards),
        "TMPDIR": str(scratch),
        "USE_TMPDIR": "1",
        "SHARED_DIR": str(shared),
        # The script appends $QEMU_OPTS; keep a caller's value out of our runs.
        "QEMU_OPTS": "",
    }
    return LaunchSpec(argv=[str(run_script), *args, *extra_args], env=env)


def create_overlay(base_disk: Path, overlay: Path, base_format: str = "raw") -> None:
    """Create the qcow2 overlay on ``base_disk`` once; later starts keep its writes."""
    if overlay.exists():
        return
    subprocess.run(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            base_format,
            "-b",
            str(base_disk),
            str(overlay),
        ],
        check=True,
        capture_output=True,
    )


PLACEHOLDER_SOCKETS = Sockets(Path("<serial>"), Path("<backdoor>"), Path("<qmp>"))
"""Socket paths standing in for a run's own in ``identity_argv``."""


def identity_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without what differs between two runs of the same guest: TCG's thread mode
    (a host choice, ``host_tcg_thread_mode``) is left out. Build ``argv`` with
    ``PLACEHOLDER_SOCKETS``, host ports 0 and a fixed marker and disk path first."""
    return [re.sub(r"^tcg,thread=\w+$", "tcg", word) for word in argv]

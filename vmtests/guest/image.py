"""The reference guest: a Debian trixie image that follows the instrumentation contract.

Built with ``mmdebstrap --mode=root`` and ``mkfs.ext4 -d`` (no loop mounts), cached under
``~/.cache/vmtests/images/<hash>`` where the hash covers every input: the package list, suite,
mirror, the suite's ssh public key and the source of this module and of the contract. A warm
start only hashes those inputs; any change to them builds a new image. Builds are serialised by
a file lock (several pytest processes may ask at once) and made atomic by building in a
temporary directory that is renamed into place.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts import instrumentation as contract
from vmtests.contracts.paths import cache_dir
from vmtests.contracts.settings import settings
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.tools import require_tools
from vmtests.guest import toolpath
from vmtests.guest.build_cache import cached_build, file_lock, run_step
from vmtests.guest.snapshot_cache import Preparation, code_digest, prepare_guest

SUITE = "trixie"
"""The newest Debian release, the closest to the NixOS the module runs on (systemd 257, Docker
26, containerd 1.7, kernel 6.12; docs/instrumentation.md)."""
PACKAGES = (
    "systemd-sysv",
    "udev",
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "python3",
    "iproute2",
    "openssh-server",
    "procps",
    "ca-certificates",
    "curl",
    "sudo",  # the ssh backend's sudo mode is tested against the reference guest
    # The serving unit runs the stub as a container, as oci-containers does on NixOS.
    "docker.io",
    # The docker command: since trixie docker.io carries only the daemon and merely recommends
    # its client (Recommends are not installed), which nixpkgs' docker package includes.
    "docker-cli",
    # The configuration's firewall, which NixOS turns on by default (vmtests/guest/firewall.py).
    "nftables",
)
DISK_SIZE = "4G"
HOSTNAME = "reference"
# The contract's kernel parameters (console, console level) come first, as on NixOS; the rest
# is this guest's own: `-cpu max` shows SVM/VMX to the guest, and udev then loads kvm, which
# takes seconds of every boot under TCG (docs/ci-time.md). Debian's kernel
# enables AppArmor, NixOS's leaves it off (`security.apparmor.enable` defaults to false, nixpkgs
# nixos/modules/security/apparmor.nix); with it on, dockerd refuses to run a container without
# apparmor_parser.
KERNEL_APPEND = " ".join(
    (
        *contract.KERNEL_PARAMS,
        "root=/dev/vda rw net.ifnames=0 modprobe.blacklist=kvm,kvm_amd,kvm_intel apparmor=0",
    )
)
DOCKER_DAEMON_JSON = '{"log-driver": "journald"}\n'
"""NixOS's ``virtualisation.docker`` daemon settings that differ from Debian's: the log driver
(nixpkgs ``nixos/modules/virtualisation/docker.nix``, ``logDriver`` defaults to journald;
``live-restore`` follows upstream's default since 24.11)."""
BOOT_TIME_MASKS = (
    # Units that only cost boot time in a throwaway test guest (TCG makes every unit count).
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "fstrim.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    # Debian's daily backup of the dpkg database (NixOS has no dpkg). A restored guest's clock
    # moves on by the hours it spent saved, so it fired after nearly every restore that
    # crossed a midnight, seconds of guest CPU in the middle of a test.
    "dpkg-db-backup.timer",
    "getty-static.service",
    "getty@tty1.service",
    "systemd-binfmt.service",
    # Debian's own nftables unit would load /etc/nftables.conf, whose `flush ruleset` also
    # removes Docker's tables; the configuration's firewall is firewall.service
    # (vmtests/guest/firewall.py), as on NixOS.
    "nftables.service",
    # Debian mounts a tmpfs on /tmp since trixie (systemd's tmp.mount, which bookworm left
    # out); NixOS keeps /tmp on the root file system (`boot.tmp.useTmpfs` defaults to false,
    # nixpkgs nixos/modules/system/boot/tmp.nix, and tmp.mount is not among the upstream units
    # of nixos/modules/system/boot/systemd.nix), so what a test leaves in /tmp survives a
    # reboot there and takes no guest memory.
    "tmp.mount",
    # Since trixie: ld.so.cache rebuilt at the first boot of every fresh guest
    # (ConditionNeedsUpdate=/etc; mmdebstrap already built it). NixOS has no ld.so.cache and no
    # such unit.
    "ldconfig.service",
)
NIXOS_ABSENT_GENERATORS = (
    # Debian's systemd runs these at every boot and every daemon-reload (each one a process,
    # guest CPU at every reload under TCG, docs/ci-time.md). NixOS has neither: nixpkgs
    # 26.11 builds systemd 260.2 (pkgs/os-specific/linux/systemd/default.nix) with no
    # sysvinit-path, and systemd v260 removed both generators (systemd/systemd NEWS, the
    # announcement in "CHANGES WITH 259").
    # A program of this guest that NixOS lacks is taken away (docs/instrumentation.md).
    "systemd-sysv-generator",
    "systemd-rc-local-generator",
)


@dataclass(frozen=True)
class ReferenceImage:
    """A built reference guest: where its parts are and how to boot it."""

    directory: Path
    kernel: Path
    initrd: Path
    disk: Path
    ssh_key: Path
    append: str
    build_seconds: float


def mirror() -> str:
    """The Debian mirror used for the build (the ``debian_mirror`` setting)."""
    return settings().debian_mirror


def suite_ssh_key_path() -> Path:
    """Where the suite's private ssh key lives (its public key beside it, ``.pub``)."""
    return cache_dir() / "ssh" / "id_ed25519"


def image_builds() -> Path:
    """The directory of the reference guest's builds, one per input hash."""
    return cache_dir() / "images"


def suite_ssh_key() -> Path:
    """The suite's ed25519 key (generated once, then reused); authorised for root in guests.

    Its public key is an input of the image (``input_hash``): a CI runner that starts empty
    keeps its image cache only if it is given the same key every run (``install_ssh_key``).
    """
    key = suite_ssh_key_path()
    with file_lock(key.parent / ".lock"):
        if not key.exists():
            require_tools("ssh-keygen")
            tmp = _fresh_tmp(key)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmtests", "-f", str(tmp)],
                check=True,
                capture_output=True,
            )
            _move_into_place(tmp, key)
    return key


def install_ssh_key(private_key: str) -> Path:
    """Make ``private_key`` (OpenSSH, without a passphrase) the suite's ssh key; return its path.

    For CI runners that start empty (``vmtests cache-key --ssh-key-stdin``): the same key on
    every run gives the image the same input hash, so a cached image is used again. The public
    key is derived from it with ``ssh-keygen -y``.
    """
    key = suite_ssh_key_path()
    with file_lock(key.parent / ".lock"):
        require_tools("ssh-keygen")
        tmp = _fresh_tmp(key)
        tmp.touch(mode=0o600)
        tmp.write_text(private_key.strip() + "\n")
        derived = subprocess.run(
            ["ssh-keygen", "-y", "-P", "", "-f", str(tmp)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if derived.returncode != 0:
            tmp.unlink()
            raise DriverError(
                "the ssh key given is not a private key without passphrase that ssh-keygen "
                f"reads: {derived.stderr.strip()}"
            )
        Path(f"{tmp}.pub").write_text(derived.stdout.strip() + "\n")
        _move_into_place(tmp, key)
    return key


def public_key_of(key: Path) -> str:
    """The public key beside the private key ``key``, as it is authorised in the guest."""
    return Path(f"{key}.pub").read_text().strip()


def _fresh_tmp(key: Path) -> Path:
    """A temporary name for a key being made beside ``key`` (its ``.pub`` too), cleared."""
    tmp = key.with_name(f"tmp-{os.getpid()}")
    for stale in (tmp, Path(f"{tmp}.pub")):
        stale.unlink(missing_ok=True)
    return tmp


def _move_into_place(tmp: Path, key: Path) -> None:
    """Rename a finished key pair onto ``key``: the public key first, the private key last."""
    os.replace(f"{tmp}.pub", f"{key}.pub")
    os.replace(tmp, key)


BACKDOOR_PROGRAM = "/usr/local/libexec/vmtests-backdoor"
"""The reference guest's backdoor shell: only that image has it (``_rendered_files``)."""


def is_reference_guest(machine: Machine) -> bool:
    """True when ``machine`` (started) is a reference guest: only there may the reference
    install step put the stub device layer."""
    return machine.execute("test -x %s", BACKDOOR_PROGRAM, timeout=30).rc == 0


def _rendered_files(public_key: str) -> dict[str, str]:
    """Files written into the rootfs: the contract's units and the guest's identity."""
    backdoor_unit = f"""[Unit]
Description=vmtests backdoor root shell on {contract.BACKDOOR_DEVICE}
Requires=dev-{contract.SERIAL_DEVICE}.device
After=dev-{contract.SERIAL_DEVICE}.device systemd-udevd.service

[Service]
# Exactly the contract's tool manifest, as the NixOS backdoor's `path` (vmtests.guest.toolpath).
Environment=PATH={toolpath.TOOLS_DIR}
ExecStart=/usr/local/libexec/vmtests-backdoor
KillSignal=SIGHUP

[Install]
WantedBy=multi-user.target
"""
    return {
        BACKDOOR_PROGRAM.lstrip("/"): contract.backdoor_script(toolpath.SHELL),
        f"etc/systemd/system/{contract.BACKDOOR_UNIT}": backdoor_unit,
        "etc/systemd/journald.conf.d/vmtests.conf": (
            f"[Journal]\nStorage={contract.JOURNAL_STORAGE}\n"
        ),
        # The host never waits for a network with a DHCP client: slirp's addresses are fixed.
        "etc/systemd/network/10-vmtests.network": (
            "[Match]\nName=eth0\n\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n"
            "DNS=10.0.2.3\n"
        ),
        "etc/ssh/sshd_config.d/vmtests.conf": "PermitRootLogin prohibit-password\nUseDNS no\n",
        "root/.ssh/authorized_keys": public_key + "\n",
        "etc/hostname": HOSTNAME + "\n",
        "etc/hosts": f"127.0.0.1 localhost\n127.0.1.1 {HOSTNAME}\n",
        "etc/fstab": "/dev/vda / ext4 rw,errors=remount-ro 0 1\n",
        "etc/docker/daemon.json": DOCKER_DAEMON_JSON,
    }


def input_hash(public_key: str) -> str:
    """Content hash of every input of the image build (the cache key)."""
    digest = hashlib.sha256()
    inputs = {
        "suite": SUITE,
        "packages": list(PACKAGES),
        "mirror": mirror(),
        "disk_size": DISK_SIZE,
        "append": KERNEL_APPEND,
        "files": _rendered_files(public_key),
        "masks": list(BOOT_TIME_MASKS),
        "masked_generators": list(NIXOS_ABSENT_GENERATORS),
    }
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    # The builder's own code is an input too: changing how the image is made rebuilds it
    # (but editing unrelated helpers in this module, e.g. start_reference_guest, does not).
    for function in (_rendered_files, _customize, _build):
        digest.update(inspect.getsource(function).encode())
    digest.update(Path(toolpath.__file__).read_bytes())
    digest.update(Path(contract.__file__).read_bytes())
    digest.update(contract.CONTRACT_FILE.read_bytes())
    return digest.hexdigest()[:20]


def _customize(rootfs: Path, public_key: str) -> None:
    """Install the contract's files and units into ``rootfs``."""
    for relative, text in _rendered_files(public_key).items():
        target = rootfs / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (rootfs / "usr/local/libexec/vmtests-backdoor").chmod(0o755)
    (rootfs / "root/.ssh").chmod(0o700)
    (rootfs / "root/.ssh/authorized_keys").chmod(0o600)
    (rootfs / "var/log/journal").mkdir(parents=True, exist_ok=True)
    try:
        toolpath.populate(rootfs)
    except ValueError as error:
        raise DriverError(f"building the tool directories: {error}") from error
    for unit in (*contract.MASKED_GETTYS, *BOOT_TIME_MASKS):
        (rootfs / "etc/systemd/system" / unit).symlink_to("/dev/null")
    generators = rootfs / "etc/systemd/system-generators"  # systemd.generator(7): /dev/null masks
    generators.mkdir(parents=True, exist_ok=True)
    for generator in NIXOS_ABSENT_GENERATORS:
        (generators / generator).symlink_to("/dev/null")
    run_step(
        [
            "chroot",
            str(rootfs),
            "systemctl",
            "enable",
            contract.BACKDOOR_UNIT,
            "systemd-networkd.service",
            "ssh.service",
        ],
        "enabling the contract's units",
    )


def _build(directory: Path, public_key: str) -> None:
    """Build the image into ``directory``: rootfs, kernel, initrd, disk."""
    require_tools("mmdebstrap", "mkfs.ext4")
    rootfs = directory / "rootfs"
    run_step(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--include=" + ",".join(PACKAGES),
            "--quiet",
            SUITE,
            str(rootfs),
            f"deb {mirror()} {SUITE} main",
        ],
        f"mmdebstrap {SUITE} rootfs",
    )
    _customize(rootfs, public_key)
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise DriverError(f"no kernel/initrd in {rootfs}/boot after mmdebstrap")
    shutil.copy2(kernels[-1], directory / "vmlinuz")
    shutil.copy2(initrds[-1], directory / "initrd.img")
    disk = str(directory / "disk.raw")
    run_step(
        ["mkfs.ext4", "-q", "-F", "-L", "vmtests-root", "-d", str(rootfs), disk, DISK_SIZE],
        "mkfs.ext4 -d rootfs disk.raw",
    )
    shutil.rmtree(rootfs)


def reference_image() -> ReferenceImage:
    """Return the reference guest image, building it first if no cached copy matches."""
    key = suite_ssh_key()
    public_key = public_key_of(key)

    def build(directory: Path) -> dict[str, Any]:
        _build(directory, public_key)
        return {"append": KERNEL_APPEND}

    final, data = cached_build(
        image_builds(), input_hash(public_key), "the reference guest image", build
    )
    return ReferenceImage(
        directory=final,
        kernel=final / "vmlinuz",
        initrd=final / "initrd.img",
        disk=final / "disk.raw",
        ssh_key=key,
        append=str(data["append"]),
        build_seconds=float(data["build_seconds"]),
    )


SETTLE_TIMEOUT = 600.0
"""Seconds a fresh boot may take to finish starting its units (Docker's take the longest)."""


def settle(machine: QemuMachine) -> None:
    """Wait until systemd has started everything of the boot (``running`` or ``degraded``)."""
    result = machine.execute("systemctl is-system-running --wait", timeout=SETTLE_TIMEOUT)
    if result.stdout_text.strip() not in ("running", "degraded"):
        raise DriverError(
            f"{machine.name}: the boot did not settle: systemctl is-system-running says "
            f"{result.stdout_text.strip()!r} (rc {result.rc})"
        )


SETTLED = Preparation("booted and settled", settle, {"code": code_digest(settle)})
"""A reference guest whose boot has finished starting its units: a restored one has no boot
work left to do (Docker's start after each boot is the largest, docs/ci-time.md)."""


def start_reference_guest(
    state_dir: Path,
    *,
    memory_mb: int = contract.GUEST_MEMORY_MB,
    cpus: int = contract.GUEST_CPUS,
    forward_ports: Sequence[int] = (),
    name: str = "reference",
    accel: str | None = None,
    image: ReferenceImage | None = None,
    append_extra: str = "",
    preparation: Preparation | None = None,
    **options: Any,
) -> QemuMachine:
    """Boot a fresh reference guest with its own overlay in ``state_dir``; return it started.

    Memory and vCPUs default to the contract's (``GUEST_MEMORY_MB``, ``GUEST_CPUS``), the same
    as the NixOS test VM's. ``forward_ports`` are guest TCP ports to forward from free host ports
    (ssh is always forwarded); look them up with ``machine.forwarded_port(port)``. With a
    ``preparation`` the guest starts in its state, restored from the snapshot cache when it can
    be (``vmtests.guest.snapshot_cache``). Other keyword ``options`` (``boot_timeout``,
    ``kvm_probe_timeout``) go to ``QemuMachine``. The caller must ``shutdown()``/``close()`` it
    (or use it as a context manager).
    """

    image = image or reference_image()
    machine = QemuMachine(
        name=name,
        state_dir=state_dir,
        kernel=image.kernel,
        initrd=image.initrd,
        append=(image.append + " " + append_extra).strip(),
        base_disk=image.disk,
        memory_mb=memory_mb,
        cpus=cpus,
        forward_ports=tuple(forward_ports),
        ssh_key=image.ssh_key,
        accel=accel,
        **options,
    )
    if preparation is not None:
        return prepare_guest(machine, preparation).machine
    try:
        machine.start()
    except BaseException:
        machine.close()
        raise
    return machine


def guest_description() -> dict[str, object]:
    """The contract fields the reference guest is built and booted from, with their values."""
    return {
        "serialDevice": contract.SERIAL_DEVICE,
        "backdoorPortName": contract.BACKDOOR_PORT_NAME,
        "backdoorReadyPrefix": contract.BACKDOOR_READY_PREFIX,
        "backdoorScript": f"rendered with shell {toolpath.SHELL}",
        "journalStorage": contract.JOURNAL_STORAGE,
        "sshUser": contract.SSH_USER,
        "maskedGettys": list(contract.MASKED_GETTYS),
        "consoleLogLevel": contract.CONSOLE_LOG_LEVEL,
        "kernelParams": list(contract.KERNEL_PARAMS),
        "resources.memoryMB": contract.GUEST_MEMORY_MB,
        "resources.cpus": contract.GUEST_CPUS,
        "tools": {
            "backdoor PATH": toolpath.TOOLS_DIR,
            "programs": sorted(contract.GUEST_TOOLS),
            "absent on purpose": dict(toolpath.NOT_ON_REFERENCE_GUEST),
        },
    }


def write_guest_description(path: Path) -> dict[str, object]:
    """Write ``guest_description()`` as JSON to ``path`` (atomically); return it."""
    description = guest_description()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"contract_fields": description}, indent=2) + "\n")
    os.replace(tmp, path)
    return description

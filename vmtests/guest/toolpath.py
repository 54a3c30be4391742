"""The programs a reference guest process may run: NixOS's PATH rules, rebuilt on Debian.

A NixOS test VM has no system PATH in its services. nixpkgs ``nixos/lib/systemd-lib.nix``
gives a service only its ``path`` plus coreutils, findutils, gnugrep, gnused and systemd
(``stage2ServiceConfig``), as ``PATH=<pkg>/bin:...:<pkg>/sbin:...``. The suite's backdoor gets
exactly the contract's tool manifest (``GUEST_TOOLS``); a unit gets its packages. Debian gives
every process ``/usr/bin``, so a command that needs a program NixOS does not provide would pass
here and fail there. The reference guest therefore runs

- its backdoor with ``PATH=TOOLS_DIR``: one symlink per program of the manifest, nothing else;
- each unit rendered from the NixOS module with ``PATH=unit_path(<its path packages>)``: one
  directory per nixpkgs package, holding every program of the Debian packages that stand in for
  it (``DEBIAN_PACKAGES``), like a store path's ``bin/``.

Both are built into the image from the rootfs's dpkg file lists (``populate``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from vmtests.contracts.instrumentation import GUEST_TOOLS

TOOLS_DIR = "/usr/lib/vmtests/tools"
"""The backdoor's whole PATH: a symlink per program of the tool manifest."""

PACKAGES_DIR = "/usr/lib/vmtests/pkgs"
"""``<PACKAGES_DIR>/<nixpkgs attribute>/bin`` holds every program of that package."""

DEBIAN_PACKAGES: dict[str, tuple[str, ...]] = {
    # nixpkgs attribute -> the Debian packages whose programs it provides.
    "bash": ("bash",),
    "coreutils": ("coreutils",),
    "curl": ("curl",),
    "docker": ("docker.io", "docker-cli"),  # trixie splits the client off the daemon
    "findutils": ("findutils",),
    "gnugrep": ("grep",),
    "gnused": ("sed",),
    "gnutar": ("tar",),
    "gzip": ("gzip",),
    "iproute2": ("iproute2",),
    "procps": ("procps",),
    "python3": ("python3-minimal", "python3"),
    "shadow": ("passwd", "login"),
    "systemd": ("systemd", "systemd-sysv"),
    "util-linux": ("util-linux", "bsdutils", "mount"),
}

DEVICE_LAYER_PROGRAMS: dict[str, str] = {
    "tt-smi": "/usr/local/bin/tt-smi",
}
"""Manifest programs the device layer provides, not Debian: the stub layer installs them at run
time (``vmtests.guest.stub_layer``), so their links dangle until then, as on a host without the
device layer. The NixOS stub module supplies the same program to the backdoor
(``vmtests.instrumentation.toolPackages`` in ``modules/tenstorrent-stub.nix``)."""

NOT_ON_REFERENCE_GUEST: dict[str, str] = {
    "nix-env": "the NixOS tier's switch command; the reference guest has no Nix store",
}
"""Manifest programs the Debian guest lacks on purpose: using one there fails with rc 127."""

SYSTEMD_DEFAULT_PATH = ("coreutils", "findutils", "gnugrep", "gnused", "systemd")
"""What nixpkgs ``nixos/lib/systemd-lib.nix`` (``stage2ServiceConfig``) appends to every
service's ``path``."""

SHELL = f"{TOOLS_DIR}/sh"
"""The backdoor's shell: bash as ``sh``, as NixOS's backdoor runs it (``pkgs.bash``'s sh)."""

_BIN_DIRS = ("usr/local/bin", "usr/bin", "bin", "usr/sbin", "sbin")


def unit_path(packages: Sequence[str] = ()) -> str:
    """``PATH=`` of a unit whose ``path`` is ``packages``, then the defaults, as NixOS writes it:
    every package's ``bin``, then every package's ``sbin`` (``stage2ServiceConfig``:
    ``makeBinPath`` then ``makeSearchPathOutput "bin" "sbin"``; an ``sbin`` that does not exist
    is harmless there and here)."""
    chosen = [*packages, *SYSTEMD_DEFAULT_PATH]  # NixOS does not remove duplicates either
    unknown = [attr for attr in chosen if attr not in DEBIAN_PACKAGES]
    if unknown:
        raise ValueError(f"no Debian stand-in for nixpkgs packages {unknown} (DEBIAN_PACKAGES)")
    return ":".join(f"{PACKAGES_DIR}/{attr}/{d}" for d in ("bin", "sbin") for attr in chosen)


def _dpkg_files(rootfs: Path, package: str) -> list[str]:
    """The files dpkg installed for ``package`` in ``rootfs`` ([] if it is not installed)."""
    info = rootfs / "var/lib/dpkg/info"
    for name in (f"{package}.list", f"{package}:amd64.list"):
        if (info / name).exists():
            return (info / name).read_text().splitlines()
    return []


def package_programs(rootfs: Path, packages: Iterable[str]) -> dict[str, str]:
    """Program name -> absolute path in the guest, for every program of Debian ``packages``."""
    programs: dict[str, str] = {}
    for package in packages:
        for path in _dpkg_files(rootfs, package):
            parent, _, name = path.rpartition("/")
            if parent.strip("/") in _BIN_DIRS and name and not (rootfs / path[1:]).is_dir():
                programs.setdefault(name, path)
    return programs


def find_program(rootfs: Path, program: str) -> str | None:
    """Where ``program`` lives in ``rootfs`` (first of the usual bin directories), or None."""
    for directory in _BIN_DIRS:
        candidate = rootfs / directory / program
        if candidate.exists() or candidate.is_symlink():
            return f"/{directory}/{program}"
    return None


def _link(directory: Path, name: str, target: str) -> None:
    link = directory / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def populate(rootfs: Path) -> dict[str, str]:
    """Build ``TOOLS_DIR`` and ``PACKAGES_DIR`` in ``rootfs``; return the manifest's links.

    Raises ``ValueError`` naming every manifest program the image lacks (other than those in
    ``NOT_ON_REFERENCE_GUEST``) and every mapped Debian package that is not installed.
    """
    missing_packages = [
        f"{debian} (for {attr})"
        for attr, debs in DEBIAN_PACKAGES.items()
        for debian in debs[:1]
        if not _dpkg_files(rootfs, debian)
    ]
    if missing_packages:
        raise ValueError(f"Debian packages missing from the image: {missing_packages}")
    for attr, debs in DEBIAN_PACKAGES.items():
        bin_dir = rootfs / PACKAGES_DIR.lstrip("/") / attr / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name, path in sorted(package_programs(rootfs, debs).items()):
            _link(bin_dir, name, path)
    tools = rootfs / TOOLS_DIR.lstrip("/")
    tools.mkdir(parents=True, exist_ok=True)
    links: dict[str, str] = {}
    missing: list[str] = []
    for program in sorted(GUEST_TOOLS):
        if program in NOT_ON_REFERENCE_GUEST:
            continue
        # bash plays sh, as on NixOS (the Debian default /bin/sh is dash).
        if program == "sh":
            target: str | None = "/bin/bash"
        elif program in DEVICE_LAYER_PROGRAMS:
            target = DEVICE_LAYER_PROGRAMS[program]
        else:
            target = find_program(rootfs, program)
        if target is None:
            missing.append(f"{program} ({GUEST_TOOLS[program]})")
            continue
        _link(tools, program, target)
        links[program] = target
    if missing:
        raise ValueError(f"tool manifest programs missing from the image: {missing}")
    return links

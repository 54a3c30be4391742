"""The stub serving image for the reference guest, built on the host from Debian packages.

The NixOS test VMs load ``vmtests-stub-vllm:latest``, a ``dockerTools.buildLayeredImage`` of
the stub server (``modules/tenstorrent-stub.nix``), through the serving module's ``imageFile``.
The reference guest loads an image of the same name, entrypoint and environment, made without
Docker or Nix on the host:

1. ``mmdebstrap --variant=extract`` unpacks ``python3-minimal`` and the standard library with
   their dependencies into a directory (no maintainer scripts: a container needs only files),
   and ``base-files``, whose merged-/usr links (``/lib64`` -> ``usr/lib64``) hold the path of the
   program interpreter every binary names; what the stub cannot use is removed (``_TRIM``:
   ``docker load`` reads the whole image at every start);
2. the stub package (``vmtests/__init__.py``, ``vmtests/stub``, ``vmtests/contracts``, the
   package the NixOS image carries too) goes to ``/opt/vmtests/vmtests``, and the image's own
   Python imports the server there as a check;
3. the tree becomes one layer of a ``docker save`` archive (``manifest.json``, the image config
   named by its digest, ``<diff id>/layer.tar``): ``docker load -i`` reads it, as it reads
   ``dockerTools`` archives;
4. the archive is also wrapped in a tar (``disk.tar``) that a reference guest gets as a
   read-only virtio disk, its stand-in for the store that holds ``imageFile`` on NixOS.

Archives are cached under ``~/.cache/vmtests/stub-images/<hash>`` like the guest image, keyed
on every input (packages, suite, mirror, the stub package's files and this builder's source).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import PACKAGE_DIR, cache_dir
from vmtests.driver.tools import require_tools
from vmtests.guest.build_cache import cached_build, run_step
from vmtests.guest.image import SUITE, mirror

IMAGE_NAME = "vmtests-stub-vllm"
IMAGE_TAG = "latest"
IMAGE = f"{IMAGE_NAME}:{IMAGE_TAG}"
"""The image reference, the same as the NixOS stub's (``modules/tenstorrent-stub.nix``)."""

PYTHON_VERSION = "3.13"
"""The python3 of ``SUITE`` (Debian trixie's default Python); the stub runs on it."""
PACKAGES = (
    "python3-minimal",
    f"libpython{PYTHON_VERSION}-stdlib",
    # Since trixie libc6 installs the program interpreter in /usr/lib64 only: the
    # /lib64/ld-linux-x86-64.so.2 that every binary names is reached through base-files'
    # merged-/usr links (bin, sbin, lib, lib64 -> usr/...), which an extract does not get
    # unless it unpacks base-files (Debian's DEP 17).
    "base-files",
)
_STDLIB = f"usr/lib/python{PYTHON_VERSION}"
_ABI = f"cpython-{PYTHON_VERSION.replace('.', '')}-x86_64-linux-gnu"
PYTHONPATH = "/opt/vmtests"
PYTHON = "/usr/bin/python3"
ENTRYPOINT = (PYTHON, "-m", "vmtests.stub.server")
ENVIRONMENT = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"PYTHONPATH={PYTHONPATH}",
    "PYTHONUNBUFFERED=1",
)
ARCHIVE_NAME = f"{IMAGE_NAME}.tar"
"""Uncompressed: ``docker load`` reads it at every start (like ``imageFile``), and gunzip of
the whole archive costs more than anything else in a start under TCG."""
DISK_NAME = "disk.tar"
DISK_SERIAL = "vmtests-stub-image"
"""Serial of the read-only virtio disk carrying the archive into a reference guest: a tar
holding ``ARCHIVE_NAME`` (tar pads to whole blocks, so a block device reads it back exactly)."""
PACKAGE_PARTS = ("__init__.py", "stub", "contracts")
_TRIM = (
    # Paths and glob patterns under the image's root, removed before the layer is made. The
    # root's bin, sbin, lib and lib64 are base-files' links into usr: patterns name usr only (a
    # pattern through a link would remove what it points to).
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
    "usr/share/common-licenses",
    "usr/share/zoneinfo",  # tzdata: the container has no /etc/localtime and the stub no zoneinfo
    "usr/share/perl5",  # debconf's, for tzdata's maintainer scripts (never run here)
    "usr/lib/x86_64-linux-gnu/gconv",  # iconv modules: Python never loads them
    "var/cache",
    # Standard library parts the stub never imports (the build imports the server to check).
    *(
        f"{_STDLIB}/{name}"
        for name in (
            *("pydoc_data", "ensurepip", "unittest", "sqlite3", "test", "idlelib", "tkinter"),
            *("turtledemo", "curses", "dbm"),
        )
    ),
    # `docker load` reads and hashes the whole image at every start (seconds per 10 MB under
    # TCG), so what the stub cannot use goes: the entrypoint is python3 itself, nothing else of
    # the package tools runs in the container ...
    "usr/sbin/*",
    "usr/bin/[!p]*",
    "usr/bin/py3*",
    # ... extension modules for terminals, databases, CJK codecs and CPython's tests ...
    *(
        f"{_STDLIB}/lib-dynload/{name}.{_ABI}.so"
        for name in (
            *("_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp", "_codecs_kr"),
            *("_codecs_tw", "_curses", "_curses_panel", "_dbm", "_sqlite3", "readline"),
            *("_test*", "_ctypes_test", "_xx*", "xxlimited*", "xxsubtype"),
        )
    ),
    # ... and the libraries only those modules and tools load. Every extension module left is
    # imported in the image at build time (_PRECOMPILE), so a library removed wrongly fails the
    # build, never a container start.
    *(
        f"usr/lib/x86_64-linux-gnu/{lib}*"
        for lib in (
            *("libdb-", "libsqlite3", "libreadline", "libhistory", "libncurses", "libtinfo"),
            *("libtirpc", "libnsl", "libkrb5", "libgssapi", "libk5crypto", "libcom_err"),
            # (not libzstd: trixie's OpenSSL, thus _ssl and _hashlib, links it)
            *("libkeyutils", "libpcre2", "libselinux", "libacl", "libmd.", "libmvec"),
            *("libformw", "libmenuw", "libpanelw", "libtic"),
            *("libcrypt.", "libgdbm", "libmemusage", "libpcprofile", "libc_malloc_debug"),
            *("libBrokenLocale", "libthread_db", "libnss_hesiod"),
        )
    ),
    "usr/lib/x86_64-linux-gnu/krb5",
    "usr/lib/x86_64-linux-gnu/engines-3",
)


_PRECOMPILE = """
import importlib, pathlib, py_compile, sys, sysconfig
sys.path.insert(0, {pythonpath!r})
import vmtests.stub.server
# Every extension module the trimmed image keeps must load: its libraries are all there.
for extension in sorted(pathlib.Path(sysconfig.get_path("platstdlib"), "lib-dynload").iterdir()):
    importlib.import_module(extension.name.split(".", 1)[0])
# Every container start would otherwise compile these again (the image has no .pyc; Debian
# writes them in postinst, which --variant=extract skips): seconds per start under TCG.
# Unchecked hashes: the layer resets every mtime, which would make timestamp .pycs stale.
for module in list(sys.modules.values()):
    source = getattr(module, "__file__", None) or ""
    if source.endswith(".py"):
        py_compile.compile(
            source, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
"""


@dataclass(frozen=True)
class StubImage:
    """A built stub image archive and what ``docker load`` will call it."""

    archive: Path
    disk: Path
    image: str
    digest: str
    archive_sha256: str
    build_seconds: float


def _package_files() -> list[Path]:
    """The stub package's files (the image's content besides Debian's), sorted."""
    files: list[Path] = []
    for part in PACKAGE_PARTS:
        path = PACKAGE_DIR / part
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [
            candidate
            for candidate in candidates
            if candidate.is_file()
            and "__pycache__" not in candidate.parts
            and candidate.suffix != ".pyc"
        ]
    return files


def copy_package(root: Path) -> Path:
    """Copy the stub's package files to ``root/vmtests`` and return that directory; a link is
    copied as the file it points to (``features.json``)."""
    package = root / "vmtests"
    for path in _package_files():
        target = package / path.relative_to(PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return package


def stub_image_builds() -> Path:
    """The directory of the stub image's builds, one per input hash."""
    return cache_dir() / "stub-images"


def input_hash() -> str:
    """Content hash of every input of the archive (the cache key)."""
    digest = hashlib.sha256()
    inputs = {
        "suite": SUITE,
        "mirror": mirror(),
        "packages": list(PACKAGES),
        "entrypoint": list(ENTRYPOINT),
        "env": list(ENVIRONMENT),
        "image": IMAGE,
    }
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    for path in _package_files():
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0")
        digest.update(path.read_bytes())  # read_bytes follows the features.json link
    digest.update(_PRECOMPILE.encode())
    digest.update(repr(_TRIM).encode())
    for function in (_build, copy_package, _layer, _archive):
        digest.update(inspect.getsource(function).encode())
    return digest.hexdigest()[:20]


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Layer entries: root-owned, fixed times; device nodes stay out (docker adds its own)."""
    if info.isdev() or info.name.startswith(("dev/", "./dev/")):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _layer(rootfs: Path) -> bytes:
    """The uncompressed layer tar of ``rootfs`` (paths relative, sorted for reproducibility)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(rootfs.rglob("*")):
            archive.add(
                str(path),
                arcname=str(path.relative_to(rootfs)),
                recursive=False,
                filter=_reset_owner,
            )
    return buffer.getvalue()


def _archive(layer: bytes, destination: Path) -> str:
    """Write a ``docker save`` archive with one ``layer``; return the image digest."""
    diff_id = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:01Z",
        "config": {"Entrypoint": list(ENTRYPOINT), "Env": list(ENVIRONMENT)},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": "1970-01-01T00:00:01Z", "created_by": "vmtests stub_image"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {
            "Config": f"{config_id}.json",
            "RepoTags": [IMAGE],
            "Layers": [f"{diff_id}/layer.tar"],
        }
    ]
    members = {
        f"{diff_id}/layer.tar": layer,
        f"{config_id}.json": config_bytes,
        "manifest.json": json.dumps(manifest).encode(),
        "repositories": json.dumps({IMAGE_NAME: {IMAGE_TAG: diff_id}}).encode(),
    }
    with tarfile.open(destination, mode="w", format=tarfile.PAX_FORMAT) as archive:
        directory = tarfile.TarInfo(diff_id)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(directory)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return f"sha256:{config_id}"


def _build(directory: Path) -> str:
    """Build the archive into ``directory``; return the image digest."""
    require_tools("mmdebstrap", "chroot")
    rootfs = directory / "rootfs"
    run_step(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=extract",
            "--include=" + ",".join(PACKAGES),
            "--quiet",
            SUITE,
            str(rootfs),
            f"deb {mirror()} {SUITE} main",
        ],
        f"mmdebstrap --variant=extract {','.join(PACKAGES)}",
    )
    for pattern in _TRIM:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    copy_package(rootfs / PYTHONPATH.lstrip("/"))
    run_step(
        ["chroot", str(rootfs), PYTHON, "-c", _PRECOMPILE.format(pythonpath=PYTHONPATH)],
        "importing the stub server with the image's own Python; precompiling what it loads",
        timeout=120,
    )
    digest = _archive(_layer(rootfs), directory / ARCHIVE_NAME)
    shutil.rmtree(rootfs)
    with tarfile.open(directory / DISK_NAME, "w", format=tarfile.PAX_FORMAT) as disk:
        disk.add(str(directory / ARCHIVE_NAME), arcname=ARCHIVE_NAME, filter=_reset_owner)
    return digest


def stub_image() -> StubImage:
    """Return the stub image archive, building it first if no cached copy matches."""

    def build(directory: Path) -> dict[str, Any]:
        image_digest = _build(directory)
        archive = (directory / ARCHIVE_NAME).read_bytes()
        return {
            "image": IMAGE,
            "digest": image_digest,
            "archive_sha256": hashlib.sha256(archive).hexdigest(),
        }

    final, data = cached_build(stub_image_builds(), input_hash(), f"the stub image {IMAGE}", build)
    return StubImage(
        archive=final / ARCHIVE_NAME,
        disk=final / DISK_NAME,
        image=str(data["image"]),
        digest=str(data["digest"]),
        archive_sha256=str(data["archive_sha256"]),
        build_seconds=float(data["build_seconds"]),
    )

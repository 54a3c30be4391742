"""Where the suite is, and where it keeps what it builds or learns once per machine."""

from __future__ import annotations

import os
from pathlib import Path

from vmtests.contracts.settings import settings

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``vmtests`` package directory (the stub image and local stub servers copy from it)."""

REPO_ROOT = PACKAGE_DIR.parent
"""The checkout: the flake, ``modules/``, ``hosts/`` and ``tests/`` beside the package; every Nix
evaluation reads it."""


def cache_dir() -> Path:
    """The suite's cache directory (the ``cache_dir`` setting, else ``$XDG_CACHE_HOME/vmtests``).

    Guest images, the ssh key, the nixpkgs trees of the eval tier and the KVM verdict live here,
    never in the repository.
    """
    explicit = settings().cache_dir
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "vmtests"


def nixpkgs_tree() -> Path | None:
    """The nixpkgs tree of the full NixOS evaluation, unchecked: the ``nixpkgs`` setting, else
    the tree ``scripts/setup-nixos-eval`` extracted into the cache (once it is complete), else
    None."""
    configured = settings().nixpkgs
    if configured is not None:
        return configured
    cached = cache_dir() / "nixpkgs"
    return cached if (cached / ".vmtests-ready").is_file() else None

"""Where the suite keeps what it builds or learns once per machine."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The suite's cache directory (``$VMTESTS_CACHE_DIR`` or ``$XDG_CACHE_HOME/vmtests``).

    Guest images, the ssh key, the nixpkgs trees of the eval tier and the KVM verdict live here,
    never in the repository.
    """
    explicit = os.environ.get("VMTESTS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "vmtests"

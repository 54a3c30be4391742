"""Evaluate the builtins-only Nix core (``modules/serving/core.nix``) from Python.

``evaluate_core`` evaluates the core (``vmtests.nixrun``, the host's Nix) with option values
given as a Python mapping, a serving profile file (``hosts/profiles/*.nix``), or both (the
mapping's keys then override the profile's, one level deep like ``//``). No nixpkgs is needed.
``find_nixpkgs_lib`` locates a nixpkgs ``lib`` for the full module evaluation of the eval tier.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import REPO_ROOT, cache_dir, nixpkgs_tree
from vmtests.contracts.serving import Hugepages
from vmtests.contracts.settings import settings
from vmtests.nixrun import NixError, evaluate_json, nix_value

CORE_FILE = REPO_ROOT / "modules" / "serving" / "core.nix"


@dataclass(frozen=True)
class CoreOutput:
    """What the core computed for one set of option values."""

    args: list[str]
    environment: dict[str, str]
    banner: str
    digest: str
    hugepages: Hugepages | None
    stop_timeout: int
    failed_assertions: list[str]
    warnings: list[str]


def core_expression(
    values: Mapping[str, Any] | None = None,
    profile_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    core_file: Path = CORE_FILE,
) -> str:
    """The Nix expression that applies ``core_file`` to the profile, values and overrides."""
    parts = []
    if profile_file is not None:
        parts.append(f"(import {nix_value(Path(profile_file))})")
    for extra in (values, overrides):
        if extra:
            parts.append(nix_value(dict(extra)))
    merged = " // ".join(parts) if parts else "{ }"
    return f"import {nix_value(Path(core_file))} ({merged})"


def evaluate_core(
    values: Mapping[str, Any] | None = None,
    profile_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    core_file: Path = CORE_FILE,
) -> CoreOutput:
    """Evaluate the core for a profile file and/or option values; see the module docstring.

    ``profile_file`` may be relative to the repository root. ``core_file`` lets tests evaluate a
    modified copy of the core.
    """
    if profile_file is not None and not Path(profile_file).is_absolute():
        profile_file = REPO_ROOT / profile_file
    data = evaluate_json(core_expression(values, profile_file, overrides, core_file))
    return CoreOutput(
        args=list(data["args"]),
        environment=dict(data["environment"]),
        banner=data["banner"],
        digest=data["digest"],
        hugepages=Hugepages.from_core(data["hugepages"]),
        stop_timeout=int(data["stopTimeout"]),
        failed_assertions=list(data["failedAssertions"]),
        warnings=list(data["warnings"]),
    )


def find_nixpkgs_lib() -> Path | None:
    """A nixpkgs ``lib`` directory: the ``nixpkgs_lib`` setting ($NIXPKGS_LIB), the cache's
    ``nixpkgs-lib``, the ``lib`` of the NixOS eval tier's nixpkgs tree ($VMTESTS_NIXPKGS or the
    one scripts/setup-nixos-eval extracted), <nixpkgs/lib>."""
    candidates: list[Path] = []
    configured = settings().nixpkgs_lib
    if configured is not None:
        candidates.append(configured)
    candidates.append(cache_dir() / "nixpkgs-lib")
    tree = nixpkgs_tree()
    if tree is not None:
        candidates.append(tree / "lib")
    for candidate in candidates:
        if (candidate / "default.nix").is_file():
            return candidate
        # A whole nixpkgs.lib checkout keeps the lib one level down.
        if (candidate / "lib" / "default.nix").is_file():
            return candidate / "lib"
    if shutil.which("nix-instantiate") and os.environ.get("NIX_PATH"):
        try:
            found = Path(str(evaluate_json("toString <nixpkgs/lib>", timeout=30)))
        except NixError:
            return None
        if (found / "default.nix").is_file():
            return found
    return None

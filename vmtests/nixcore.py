"""Evaluate the builtins-only Nix core (``modules/serving/core.nix``) from Python.

``evaluate_core`` runs ``nix-instantiate --eval --strict --json`` on the core with option values
given as a Python mapping, a serving profile file (``hosts/profiles/*.nix``), or both (the
mapping's keys then override the profile's, one level deep like ``//``). No nixpkgs is needed.
``find_nixpkgs_lib`` locates a nixpkgs ``lib`` for the full module evaluation of the eval tier.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import cache_dir, nixpkgs_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
CORE_FILE = REPO_ROOT / "modules" / "serving" / "core.nix"
NIX_TIMEOUT = 120.0


class NixError(RuntimeError):
    """nix-instantiate is missing, or an evaluation failed (the message carries its stderr)."""


@dataclass(frozen=True)
class CoreOutput:
    """What the core computed for one set of option values."""

    args: list[str]
    environment: dict[str, str]
    banner: str
    digest: str
    hugepages: dict[str, Any] | None
    stop_timeout: int
    failed_assertions: list[str]
    warnings: list[str]


def nix_instantiate() -> str:
    """Path of ``nix-instantiate``; raises ``NixError`` saying how to install it when missing."""
    found = shutil.which("nix-instantiate")
    if found is None:
        raise NixError(
            "nix-instantiate is not on PATH: install Nix (on Debian: apt-get install nix-bin)"
        )
    return found


def nix_string(text: str) -> str:
    """Quote ``text`` as a Nix string literal (JSON escapes are valid Nix escapes, bar ``${``)."""
    return json.dumps(text).replace("${", "\\${")


def nix_value(value: object) -> str:
    """Render a JSON-like Python value as a Nix expression."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return nix_string(value)
    if isinstance(value, Path):
        return f"(/. + {nix_string(str(value.resolve()))})"
    if isinstance(value, Mapping):
        fields = " ".join(f"{nix_string(str(k))} = {nix_value(v)};" for k, v in value.items())
        return "{ " + fields + " }"
    if isinstance(value, list | tuple):
        return "[ " + " ".join(f"({nix_value(item)})" for item in value) + " ]"
    raise TypeError(f"cannot render {type(value).__name__} {value!r} as a Nix value")


def evaluate_json(expression: str, *, cwd: Path = REPO_ROOT, timeout: float = NIX_TIMEOUT) -> Any:
    """Evaluate a Nix ``expression`` strictly and return it decoded from JSON."""
    command = [nix_instantiate(), "--eval", "--strict", "--json", "-E", expression]
    try:
        result = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise NixError(
            f"nix-instantiate did not finish within {timeout:.0f}s: {expression}"
        ) from error
    if result.returncode != 0:
        raise NixError(
            f"nix-instantiate failed (rc={result.returncode}) evaluating:\n{expression}\n"
            f"--- stderr ---\n{result.stderr.strip()}"
        )
    return json.loads(result.stdout)


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
        hugepages=data["hugepages"],
        stop_timeout=int(data["stopTimeout"]),
        failed_assertions=list(data["failedAssertions"]),
        warnings=list(data["warnings"]),
    )


def find_nixpkgs_lib() -> Path | None:
    """A nixpkgs ``lib`` directory: $NIXPKGS_LIB, ~/.cache/vmtests/nixpkgs-lib, the ``lib`` of
    the NixOS eval tier's nixpkgs tree ($VMTESTS_NIXPKGS or the one scripts/setup-nixos-eval
    extracted), <nixpkgs/lib>."""
    candidates: list[Path] = []
    if os.environ.get("NIXPKGS_LIB"):
        candidates.append(Path(os.environ["NIXPKGS_LIB"]).expanduser())
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
        result = subprocess.run(
            ["nix-instantiate", "--find-file", "nixpkgs/lib"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        found = Path(result.stdout.strip())
        if result.returncode == 0 and (found / "default.nix").is_file():
            return found
    return None

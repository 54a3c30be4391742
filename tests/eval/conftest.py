"""Fixtures of the eval tier: nix-instantiate, a nixpkgs lib and the full NixOS evaluation,
each skipped with the reason when unavailable."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from vmtests.nixcore import find_nixpkgs_lib
from vmtests.nixos_eval import NixosEvalUnavailable, evaluate


@pytest.fixture(scope="session")
def nix() -> str:
    """Path of nix-instantiate; skips the test (with how to get it) when it is missing."""
    found = shutil.which("nix-instantiate")
    if found is None:
        pytest.skip("nix-instantiate not found: install Nix (Debian: apt-get install nix-bin)")
    return found


@pytest.fixture(scope="session")
def nixpkgs_lib(nix: str) -> Path:
    """A nixpkgs lib for full module evaluation; skips with the search order when none is found."""
    found = find_nixpkgs_lib()
    if found is None:
        pytest.skip(
            "no nixpkgs lib: set $NIXPKGS_LIB, put nix-community/nixpkgs.lib at "
            "~/.cache/vmtests/nixpkgs-lib, set up the NixOS eval tier's tree "
            "(scripts/setup-nixos-eval <nixpkgs git snapshot>), or provide <nixpkgs/lib> "
            "via NIX_PATH"
        )
    return found


@pytest.fixture(scope="session")
def nixos() -> dict[str, Any]:
    """The full NixOS evaluation of the flake, once per session (vmtests.nixos_eval);
    skips, naming the set-up step, when no nixpkgs tree or no capable Nix is found."""
    try:
        return evaluate()
    except NixosEvalUnavailable as error:
        pytest.skip(str(error))

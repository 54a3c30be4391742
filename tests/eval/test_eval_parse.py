"""(a) Every .nix file in the repository parses (``nix-instantiate --parse``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vmtests.contracts.paths import REPO_ROOT

SKIP_DIRS = {".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules", "result"}


def nix_files() -> list[Path]:
    """Every .nix file under the repository root, outside caches and build results."""
    return sorted(
        path
        for path in REPO_ROOT.rglob("*.nix")
        if not SKIP_DIRS.intersection(path.relative_to(REPO_ROOT).parts)
    )


def test_the_repository_has_the_nix_files_of_the_module() -> None:
    found = {str(path.relative_to(REPO_ROOT)) for path in nix_files()}
    expected = {
        "flake.nix",
        "modules/tenstorrent-serving.nix",
        "modules/serving/core.nix",
        "modules/serving/defaults.nix",
        "hosts/profiles/cfx-llm2.nix",
        "hosts/profiles/resident.nix",
    }
    assert expected <= found, f"missing .nix files: {sorted(expected - found)}"


@pytest.mark.nix
@pytest.mark.parametrize("path", nix_files(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_nix_file_parses(nix: str, path: Path) -> None:
    result = subprocess.run(
        [nix, "--parse", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"{path.relative_to(REPO_ROOT)} does not parse:\n{result.stderr}"

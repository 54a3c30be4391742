"""flake.nix, evaluated as far as it goes without nixpkgs (a lib and a fake package set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vmtests.nixrun import evaluate_json, nix_value

pytestmark = pytest.mark.nix

FLAKE_EVAL = Path(__file__).resolve().parent / "flake-eval.nix"


@pytest.fixture(scope="module")
def flake(nixpkgs_lib: Path) -> dict[str, Any]:
    result: dict[str, Any] = evaluate_json(
        f"import {nix_value(FLAKE_EVAL)} {{ lib = import {nix_value(nixpkgs_lib)}; }}"
    )
    return result


def test_the_flake_has_its_outputs(flake: dict[str, Any]) -> None:
    outputs = set(flake["outputs"])
    assert {"nixosModules", "nixosConfigurations", "checks", "apps", "devShells", "formatter"} <= (
        outputs
    )
    assert flake["apps"] == [
        "persistence", "persistence-cfx-llm2", "persistence-resident",
        "shell", "shell-cfx-llm2", "shell-resident",
    ]  # fmt: skip
    assert flake["devShells"] == ["default"]


def test_the_flake_exports_the_modules_and_hosts(flake: dict[str, Any]) -> None:
    modules = flake["nixosModules"]
    assert isinstance(modules, dict)
    assert set(modules) >= {"tenstorrent-serving", "tenstorrent-stub", "test-instrumentation"}
    missing = [path for path in modules.values() if not Path(path).is_file()]
    assert not missing, f"nixosModules point at missing files: {missing}"
    assert set(flake["nixosConfigurations"]) >= {
        "cfx-llm2",
        "vm-test-base",
        "vm-test-cfx-llm2",
        "vm-test-resident",
    }


def test_the_core_check_covers_every_serving_profile(flake: dict[str, Any]) -> None:
    results = flake["coreProfiles"]
    assert isinstance(results, dict)
    assert set(results) == {"baseline", "cfx-llm2", "resident"}
    for name, result in results.items():
        assert result["failedAssertions"] == [], name
    assert "--no-async-scheduling" in results["cfx-llm2"]["args"]
    assert "core-profiles" in flake["checks"]
    # The main job runs under `nix flake check` for every serving profile.
    assert {"persistence-cfx-llm2", "persistence-resident"} <= set(flake["checks"])

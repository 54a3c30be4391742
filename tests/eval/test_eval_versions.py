"""The NixOS column of the version table comes from the full NixOS evaluation when a nixpkgs tree
is set up (tests/eval/nixos-eval.nix ``versions``, vmtests.scenario.runner.versions); skipped,
naming the set-up step, when none is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nixos_support import ALL_CONFIGURATIONS

from vmtests.profiles import load_profile
from vmtests.report import write_scenario_report
from vmtests.scenario.runner.scenario import ScenarioResult
from vmtests.scenario.runner.versions import COMPONENTS, stands_in_for

pytestmark = pytest.mark.nix


def test_every_configuration_gives_a_version_or_why_for_each_row(nixos: dict[str, Any]) -> None:
    for name in ALL_CONFIGURATIONS:
        versions = nixos["configurations"][name]["versions"]
        assert set(versions) == {c.key for c in COMPONENTS}, name
        for key, item in versions.items():
            assert ("version" in item) != ("why" in item), (name, key, item)
        # What a NixOS host certainly runs is evaluated, never explained away.
        for key in ("systemd", "docker", "containerd", "kernel"):
            assert versions[key].get("version"), (name, key, versions[key])
        # docker's containerd carries docker's own version attribute: the cell is containerd's.
        assert versions["containerd"]["version"] != versions["docker"]["version"]


def test_the_containerd_and_kernel_cells_are_what_the_machine_prints(
    nixos: dict[str, Any],
) -> None:
    """containerd: the version docker-containerd's makeFlags make the binary claim (nixpkgs
    pkgs/by-name/co/containerd/package.nix, kept by docker's overrideAttrs), first in the
    cell; kernel: modDirVersion, what /proc/sys/kernel/osrelease prints."""
    for name in ALL_CONFIGURATIONS:
        described = nixos["configurations"][name]
        sources, versions = described["versionSources"], described["versions"]
        flags = [f for f in sources["dockerContainerdMakeFlags"] if f.startswith("VERSION=")]
        claimed = flags[0].removeprefix("VERSION=v")
        assert claimed, (name, sources)
        assert versions["containerd"]["version"].split(" ", 1)[0] == claimed, name
        assert versions["kernel"]["version"] == sources["kernelModDirVersion"], name


def test_the_production_host_names_its_tt_smi(nixos: dict[str, Any]) -> None:
    """cfx-llm2 installs nixpkgs' tt-smi (hardware.tenstorrent): its version, or, where the
    trimmed tree stubs the package, why there is none; the VM configurations run the stub."""
    tt_smi = nixos["configurations"]["cfx-llm2"]["versions"]["tt-smi"]
    if nixos["shim"]:
        assert "tt-smi is stubbed" in tt_smi["why"]
    else:
        assert tt_smi.get("version"), tt_smi
    assert "stub device layer" in nixos["configurations"]["vm-test-cfx-llm2"]["versions"][
        "tt-smi"
    ].get("why", "")


def test_the_reports_nixos_column_is_the_evaluation(nixos: dict[str, Any], tmp_path: Path) -> None:
    profile = load_profile("cfx-llm2")
    result = ScenarioResult(profile, "qemu:reference", "reference install step")
    result.nixos_versions = stands_in_for(profile.serving_profile)
    paths = write_scenario_report(result, tmp_path)
    table = json.loads(paths["json"].read_text())["version_table"]
    configuration = table["nixos_configuration"]
    assert table["nixos_evaluated"] is True
    assert nixos["environment"] in table["nixos_source"]
    evaluated = nixos["configurations"][configuration]["versions"]
    expected = [
        evaluated[c.key].get("version") or f"not evaluated: {evaluated[c.key]['why']}"
        for c in COMPONENTS
    ]
    assert [row["nixos"] for row in table["rows"]] == expected
    summary = paths["markdown"].read_text()
    for row in table["rows"]:
        assert f"| {row['component']} | {row['run']} | {row['nixos']} |" in summary

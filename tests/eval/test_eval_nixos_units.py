"""The reference guest's units are the full NixOS evaluation's
(vmtests.scenario.install.nixos_units).

For every VM configuration: the units and job scripts NixOS renders map completely onto the
reference guest (no store path left), and ``vmtests.scenario.install.serving_unit``, which the
negative controls vary, renders exactly the same files from the Nix core's output. Each check is
shown catching its fault.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from nixos_support import VM_CONFIGURATIONS

from vmtests import nixos_eval
from vmtests.guest import toolpath
from vmtests.guest.stub_image import IMAGE
from vmtests.nixcore import evaluate_core
from vmtests.scenario.install import nixos_units
from vmtests.scenario.install.reference_switch import (
    ServingConfig,
    imitate_units,
    render_units,
    rendered_by_nixos,
)
from vmtests.scenario.install.serving_unit import STORE_DIR

pytestmark = pytest.mark.nix

IMAGE_FILE = f"{STORE_DIR}/0123456789abcdefghijklmnopqrstuv-vmtests-stub-vllm.tar.gz"
SERVING_PROFILES = {
    "vm-test-base": "hosts/profiles/baseline.nix",
    "vm-test-cfx-llm2": "hosts/profiles/cfx-llm2.nix",
    "vm-test-resident": "hosts/profiles/resident.nix",
}


def core_config(serving_profile: str) -> ServingConfig:
    """The reference guest's configuration for ``serving_profile`` before NixOS's units."""
    core = evaluate_core(profile_file=Path(serving_profile))
    return replace(ServingConfig.from_core(core), image=IMAGE, image_file=IMAGE_FILE)


def test_every_vm_configuration_is_covered() -> None:
    assert set(SERVING_PROFILES) == set(VM_CONFIGURATIONS)
    for configuration, serving_profile in SERVING_PROFILES.items():
        assert nixos_units.configuration_for(serving_profile) == configuration
    with pytest.raises(ValueError, match="not a serving profile"):
        nixos_units.configuration_for("hosts/cfx-llm2/host.nix")


@pytest.mark.parametrize("configuration", VM_CONFIGURATIONS)
def test_nixos_units_map_completely_onto_the_guest(
    nixos: dict[str, Any], configuration: str
) -> None:
    units = nixos_units.rendered_units(configuration, IMAGE_FILE)
    files = [*units.units.values(), *units.scripts.values(), *units.scripts]
    assert not any("/nix/store/" in text for text in files)
    serving = units.units["tenstorrent-serving.service"]
    path = next(line for line in serving.splitlines() if line.startswith('Environment="PATH='))
    entries = path.removeprefix('Environment="PATH=').rstrip('"').split(":")
    assert all(entry.startswith(toolpath.PACKAGES_DIR + "/") for entry in entries), entries
    assert f"{toolpath.PACKAGES_DIR}/docker/bin" in entries
    pre_start = next(
        t for p, t in units.scripts.items() if p.endswith("/tenstorrent-serving-pre-start")
    )
    assert f"docker load -i {IMAGE_FILE}" in pre_start
    assert all(p.startswith(STORE_DIR + "/") for p in units.scripts)


@pytest.mark.parametrize("configuration", VM_CONFIGURATIONS)
def test_the_renderer_renders_what_nixos_renders(nixos: dict[str, Any], configuration: str) -> None:
    config = rendered_by_nixos(
        core_config(SERVING_PROFILES[configuration]), SERVING_PROFILES[configuration]
    )
    assert config.nixos is not None
    assert nixos_units.differences(imitate_units(config), config.nixos.units) == []
    # The guest installs NixOS's files for this configuration ...
    assert render_units(config) is config.nixos.units
    # ... and the renderer's for any configuration a control altered.
    altered = replace(config, stop_timeout=30)
    assert render_units(altered) is not config.nixos.units
    assert "TimeoutStopSec=60" in render_units(altered).units["tenstorrent-serving.service"]


def test_a_renderer_that_differs_from_nixos_is_caught(nixos: dict[str, Any]) -> None:
    config = rendered_by_nixos(
        core_config(SERVING_PROFILES["vm-test-cfx-llm2"]), "hosts/profiles/cfx-llm2.nix"
    )
    assert config.nixos is not None
    forced = imitate_units(replace(config, graceful_pre_start=False))  # oci-containers' rm -f
    found = nixos_units.differences(forced, config.nixos.units)
    assert len(found) == 1  # the pre-start script (store hashes are not compared)
    assert any("docker rm -f tenstorrent-serving" in diff for diff in found)
    no_volume = imitate_units(replace(config, extra_options=()))  # the host's option lost
    assert any(
        "/var/lib/models" in diff for diff in nixos_units.differences(no_volume, config.nixos.units)
    )


def test_an_unknown_store_path_is_refused(nixos: dict[str, Any]) -> None:
    description = nixos_eval.describe("vm-test-cfx-llm2")
    mapping = nixos_units.store_map(
        {**description, "toolPackages": {}}, IMAGE_FILE
    )  # no manifest packages: docker, coreutils, ... are unknown
    unit = description["units"]["serving"]["text"]
    with pytest.raises(nixos_units.UnmappedStorePath, match="-docker-"):
        mapping.apply(unit, "tenstorrent-serving.service")
    with pytest.raises(nixos_units.UnmappedStorePath, match="no file on the guest"):
        nixos_units.store_map(description, None)


HASH = "0123456789abcdfghijklmnpqrsvwxyz"


def test_store_paths_map_exactly_or_are_refused() -> None:
    mapping = nixos_units.StoreMap({f"/nix/store/{HASH}-docker-29.6.0": "/pkgs/docker"})
    text = f"PATH=/nix/store/{HASH}-docker-29.6.0/bin:/nix/store/{HASH}-docker-29.6.0/sbin"
    assert mapping.apply(text, "t") == "PATH=/pkgs/docker/bin:/pkgs/docker/sbin"
    zoneinfo = f"$(ls /nix/store/{HASH}-tzdata-2026b/share/zoneinfo)"
    assert mapping.apply(zoneinfo, "t") == "$(ls /usr/share/zoneinfo)"  # nothing swallowed
    with pytest.raises(nixos_units.UnmappedStorePath, match="tzdata-2026b/bin"):
        mapping.apply(f"PATH=/nix/store/{HASH}-tzdata-2026b/bin", "t")  # not a whole tree
    with pytest.raises(nixos_units.UnmappedStorePath, match="python3"):
        mapping.apply(f"exec /nix/store/{HASH}-python3-3.13/bin/python3", "t")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strict": True}, "enableStrictShellChecks"),
        ({"links": {"aliases": ["x"]}}, "links"),
        ({"enable": False}, "enable = False"),
        ({"overrideStrategy": "asDropin"}, "drop-in"),
    ],
)
def test_what_the_mapping_cannot_carry_is_refused(
    nixos: dict[str, Any], monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], message: str
) -> None:
    description = nixos_eval.describe("vm-test-cfx-llm2")
    units = {**description["units"], "serving": {**description["units"]["serving"], **change}}
    monkeypatch.setattr(nixos_eval, "describe", lambda name: {**description, "units": units})
    with pytest.raises(nixos_units.UnmappedStorePath, match=message):
        nixos_units.rendered_units("vm-test-cfx-llm2", IMAGE_FILE)

"""The serving unit's start script as the full NixOS evaluation renders it: the checked-in copy
that the scenario's container check is tested on must still be what NixOS renders, and it must
read back as the container the configuration declares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rendered_unit import rendered_unit

from vmtests.scenario.judgement.container_run import parse_container_run

pytestmark = pytest.mark.nix

FIXTURE = (
    Path(__file__).resolve().parents[1]
    / "scenario"
    / "data"
    / "tenstorrent-serving-start-cfx-llm2.sh"
)


def _without_comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("# ")]


def test_the_checked_in_start_script_is_what_nixos_renders(nixos: dict[str, Any]) -> None:
    start = rendered_unit("cfx-llm2").exec_start
    assert start is not None
    assert start.script is not None
    assert _without_comments(FIXTURE.read_text()) == _without_comments(start.file_text()), (
        f"{FIXTURE} is out of date: regenerate it as its header says"
    )


@pytest.mark.parametrize("name", ["cfx-llm2", "vm-test-cfx-llm2", "vm-test-resident"])
def test_the_rendered_start_script_reads_back_as_the_declared_container(
    nixos: dict[str, Any], name: str
) -> None:
    """Oracle: the evaluated ``virtualisation.oci-containers.containers.tenstorrent-serving``."""
    container = nixos["configurations"][name]["container"]
    start = rendered_unit(name).exec_start
    assert start is not None
    assert start.script is not None
    run = parse_container_run(start.file_text())
    assert run is not None
    assert run.image == container["image"]
    assert run.environment == container["environment"]
    assert run.args == container["cmd"]

"""The evidence script, run by the host's ``sh`` against fake tools: every part is collected,
named, bounded and redacted; a machine that no longer answers gives one part saying so."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from scenario_support import LocalShell

from vmtests.driver.errors import MachineGone
from vmtests.driver.machine import CommandResult, Machine
from vmtests.scenario.collection.evidence import collect_evidence, evidence_command

TOOLS = {
    "journalctl": 'case "$*" in *" -k "*) echo "tenstorrent: Loading Tenstorrent AI driver '
    'module v2.10.0"; echo "usb 1-1: new device";; *"-b -1"*) echo previous-boot-line;; '
    '*) echo "current-boot-line HF_TOKEN=hf_evidence_secret";; esac',
    "systemctl": 'echo "status of $*"',
    "docker": 'echo "docker $1 $*"',
    "tt-smi": 'echo \'{"time": "now"}\'',
    "systemd-analyze": 'echo "Startup finished in 19.0s (firmware) + 2.9s (loader)"',
}


def test_every_part_is_collected_and_redacted(tmp_path: Path) -> None:
    for name, body in TOOLS.items():
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    machine = cast(Machine, LocalShell(f"{tmp_path}:/usr/bin:/bin"))
    parts = collect_evidence(machine, container="tenstorrent-serving")
    assert list(parts) == [
        "journal-current-boot", "journal-previous-boot", "systemctl-status", "docker-inspect",
        "container-log", "kernel-tenstorrent", "meminfo", "tt-smi", "systemd-analyze-time",
    ]  # fmt: skip
    assert "current-boot-line" in parts["journal-current-boot"]
    assert "hf_evidence_secret" not in parts["journal-current-boot"]
    assert parts["journal-previous-boot"] == "previous-boot-line\n"
    assert parts["systemctl-status"] == (
        "status of status --no-pager -l tenstorrent-serving.service tenstorrent-hugepages.service\n"
    )
    assert parts["docker-inspect"].startswith("docker inspect")
    assert "logs --tail 500 tenstorrent-serving" in parts["container-log"]
    assert parts["kernel-tenstorrent"] == (
        "tenstorrent: Loading Tenstorrent AI driver module v2.10.0\n"
    )
    assert "MemAvailable" in parts["meminfo"]
    assert "(firmware)" in parts["systemd-analyze-time"]
    assert "collection" not in parts


def test_without_a_container_the_container_parts_say_so() -> None:
    command = evidence_command(container=None)
    assert "'' 3000 500 60" in command


class _Gone:
    name = "gone"

    def execute(self, command: str, *args: object, timeout: float) -> CommandResult:
        raise MachineGone("gone: the ssh session ended")


def test_a_machine_that_is_gone_gives_one_part_saying_so() -> None:
    parts = collect_evidence(cast(Machine, _Gone()))
    assert parts == {
        "unavailable": "the evidence could not be collected: gone: the ssh session ended"
    }

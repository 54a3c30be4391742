"""The certification's A/B gate end to end against ONE reference guest with the stub (CI).

A guest of its own (``test_certify_vm.py`` has the other gates), so that the two halves run in
parallel. The A/B runs 2 ABBA blocks here instead of the default 3 (the per-run request count
is unchanged), at a larger time scale than the other gates: a configured step factor leaves the
noise band in the right direction, no factor stays inside, and an interrupt in the middle of an
arm leaves the host on the configuration it started from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from certify_vm_support import (
    AB_TIME_SCALE,
    CI_TIME_SCALE,
    NO_EFFECT,
    run,
    set_knobs,
)

from vmtests.certify import gates_perf, stats
from vmtests.certify.loadgen import BatchResult
from vmtests.driver.qemu import QemuMachine
from vmtests.stub import knobs

pytestmark = [pytest.mark.vm, pytest.mark.guest_seconds(721)]


def test_ab_without_a_factor_stays_inside_the_noise_band(
    guest: QemuMachine, tmp_path: Path
) -> None:
    set_knobs(guest, **{knobs.TIME_SCALE: AB_TIME_SCALE, knobs.STEP_FACTORS: NO_EFFECT})
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    gate = result.gate("ab")
    assert gate is not None
    assert gate.status == "passed", gate.problems
    assert gate.numbers["decision"] == "inside-noise-band", gate.numbers["decision_text"]
    assert len(result.switches) == 8  # 2 ABBA blocks, each arm a real switch
    assert all(switch.ok for switch in result.switches)
    assert [s.configuration for s in result.switches[:4]] == [
        "cfx-llm2", "resident", "resident", "cfx-llm2",
    ]  # fmt: skip
    assert result.left_on == "cfx-llm2"


def test_ab_step_factor_leaves_the_noise_band(guest: QemuMachine, tmp_path: Path) -> None:
    factors = json.dumps({"deviceResident": 0.8, "deviceArgmax": 1.0})
    set_knobs(guest, **{knobs.TIME_SCALE: AB_TIME_SCALE, knobs.STEP_FACTORS: factors})
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    gate = result.gate("ab")
    assert gate is not None
    assert gate.numbers["decision"] == "faster", gate.numbers.get("decision_text")
    ratio = gate.numbers["ratios"]["decode_step"]
    assert ratio["ci_high"] < 1 - stats.NOISE_BAND
    assert result.left_on == "cfx-llm2"


def test_interrupt_restores_the_starting_configuration(
    guest: QemuMachine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_knobs(guest, **{knobs.TIME_SCALE: CI_TIME_SCALE, knobs.STEP_FACTORS: NO_EFFECT})
    measured: list[BatchResult] = []
    original = gates_perf.run_figures

    def interrupt_in_arm_b(batch: BatchResult) -> dict[str, float]:
        measured.append(batch)
        if len(measured) == 2:  # the first B run of the first ABBA block: the host is on B
            raise KeyboardInterrupt
        return original(batch)

    monkeypatch.setattr(gates_perf, "run_figures", interrupt_in_arm_b)
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    assert result.status == "interrupted"
    assert result.exit_status == 3
    assert [s.configuration for s in result.switches] == ["cfx-llm2", "resident", "cfx-llm2"]
    assert result.switches[-1].reason == "restore the starting configuration"
    assert result.switches[-1].ok
    assert result.left_on == "cfx-llm2"
    data = json.loads((tmp_path / "certificate.json").read_text())
    assert data["status"] == "interrupted"
    assert data["left_on"] == "cfx-llm2"

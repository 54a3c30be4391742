"""What the certification's VM tests share: a reference guest serving cfx-llm2 (the stub in a
container), with the production profile deployed as the module renders it, restored from the
snapshot cache (the state the negative controls start from); the stub's knobs set in the stub
device layer's knobs file and applied by a restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmtests.certify.arms import reference_switch
from vmtests.certify.context import Options
from vmtests.certify.model import CertificationResult
from vmtests.certify.run import certify
from vmtests.contracts.serving import SERVING_PORT, SERVING_UNIT
from vmtests.driver.qemu import QemuMachine
from vmtests.guest import REFERENCE_TARGET
from vmtests.guest.stub_layer import set_stub_knobs
from vmtests.profiles import load_profile
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.install.switching import wait_ready
from vmtests.scenario.prepared import prepared_reference_guest, target_serving

KILL_DROP_IN = f"/etc/systemd/system/{SERVING_UNIT}.d/91-vmtests-kill.conf"
CI_TIME_SCALE = "0.05"
# The A/B measures decode steps: at 0.5 a modelled step (24 ms x batch growth) is well above the
# guest's own per-token CPU cost under TCG, so the arms differ by the model, not by the emulator.
AB_TIME_SCALE = "0.5"
# Resident decode and argmax both at 1.0: the two arms differ in configuration, not in speed.
NO_EFFECT = json.dumps({"deviceResident": 1.0, "deviceArgmax": 1.0})


def set_knobs(machine: QemuMachine, **env: str) -> None:
    """Set the stub knobs ``env`` for the serving container and restart the unit (graceful)."""
    set_stub_knobs(machine, **env)
    machine.succeed(f"systemctl restart {SERVING_UNIT}", timeout=360)
    wait_ready(machine, SERVING_PORT, timeout=180)


def serving_guest(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[QemuMachine]:
    """A reference guest serving cfx-llm2 (stub), closed after use; the ``guest`` fixture."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    state_dir = tmp_path_factory.mktemp(f"{name}-guest")
    with prepared_reference_guest(state_dir, target_serving(switch), name) as prepared:
        yield prepared.machine


def run(
    machine: QemuMachine, report: Path, ab: str | None = None, **options: object
) -> CertificationResult:
    """Certify cfx-llm2 on the guest with the repository's golden values."""
    return certify(
        machine,
        load_profile("cfx-llm2"),
        target=REFERENCE_TARGET,
        switcher=reference_switch(load_profile("cfx-llm2")),
        report_dir=report,
        options=Options(**options),  # type: ignore[arg-type]
        ab_profile=load_profile(ab) if ab else None,
    )

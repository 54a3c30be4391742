"""What the certification's VM tests share: a reference guest serving cfx-llm2 (the stub in a
container), with the production profile deployed as the module renders it and the stub's knobs
set in the stub device layer's knobs file and applied by a restart, restored from the snapshot
cache (one state per set of knobs, each a child of the state the negative controls start
from)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from vmtests.certify.arms import reference_switch
from vmtests.certify.context import Options
from vmtests.certify.model import CertificationResult
from vmtests.certify.run import certify
from vmtests.contracts.serving import SERVING_PORT, SERVING_UNIT
from vmtests.driver.qemu import QemuMachine
from vmtests.guest import REFERENCE_TARGET
from vmtests.guest.snapshot_cache import Preparation, code_digest
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


def with_knobs(switch: ReferenceSwitch, **env: str) -> Preparation:
    """``target_serving`` with the stub knobs ``env`` set and the unit restarted (``set_knobs``):
    a state of its own in the snapshot cache, so that a test starts serving with its knobs
    instead of paying a restart for them on every run."""

    def apply_knobs(machine: QemuMachine) -> None:
        set_knobs(machine, **env)

    return Preparation(
        f"{switch.profile.name} serving, stub knobs {', '.join(sorted(env)) or 'none'}",
        apply_knobs,
        {"knobs": dict(sorted(env.items())), "code": code_digest(apply_knobs, set_knobs)},
        parent=target_serving(switch),
    )


ServingGuest = Callable[..., QemuMachine]
"""``serving_guest(**knobs)``: a guest serving cfx-llm2 with the stub knobs ``knobs`` set."""


def serving_guests(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[ServingGuest]:
    """Reference guests serving cfx-llm2 (stub), each restored with the stub knobs it is asked
    for (``with_knobs``) and closed at the end; the ``serving_guest`` fixture."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    with ExitStack() as guests:

        def serving_guest(**env: str) -> QemuMachine:
            state_dir = tmp_path_factory.mktemp(f"{name}-guest")
            preparation = with_knobs(switch, **env)
            prepared = guests.enter_context(prepared_reference_guest(state_dir, preparation, name))
            return prepared.machine

        yield serving_guest


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

"""Every negative control proven without a VM: its mechanism, applied to a snapshot of the correct
configuration recorded on the reference guest, raises exactly the control's declared findings
and nothing else (a false-alarm control, and the correct configuration, raise nothing). The VM
tests prove the same controls on a guest (test_controls_vm.py).

``data/snapshot-cfx-llm2-target.json`` is the S2 snapshot of cfx-llm2's scenario on the
reference guest (the NixOS evaluation's units, the stub in its container), as report.json holds
it, with the previous boot's journal cut to its last start. The restart evidence recorded since
(the unit's ``NRestarts``, ``ExecMainCode`` and ``ExecMainStatus``, the container's restart count
and exit code) was added as a steady guest shows it: no restart, exit status 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.profiles import load_profile
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.controls.catalogue import (
    CONTROLS,
    CORRECT_CONFIGURATION,
    EVERY_FOOTPRINT,
    RM_F,
)
from vmtests.scenario.controls.container_stop import check_stopped_gracefully, parse_events
from vmtests.scenario.controls.control import Control, Declaration, judge
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.results import CheckResult, findings

CFX = load_profile("cfx-llm2")
RECORDED = json.loads(
    (Path(__file__).parent / "data" / "snapshot-cfx-llm2-target.json").read_text()
)
EVERY_CONTROL = (CORRECT_CONFIGURATION, *CONTROLS)


def recorded() -> Snapshot:
    """A fresh copy of the recorded snapshot of the correct configuration."""
    return Snapshot.from_dict(RECORDED)


def effect_results(control: Control) -> list[CheckResult]:
    """Every single-snapshot check after ``control``'s mechanism on the recorded snapshot."""
    snapshot = recorded()
    control.effect(snapshot)
    return evaluate_stage(CFX, snapshot)


def test_the_recording_is_the_correct_configuration_of_the_container_path() -> None:
    snapshot = recorded()
    assert findings(evaluate_stage(CFX, snapshot)) == set()
    assert snapshot.container is not None
    assert snapshot.server is snapshot.container.process
    assert len(snapshot.start_script) == 1


@pytest.mark.parametrize("control", EVERY_CONTROL, ids=[c.name for c in EVERY_CONTROL])
def test_the_mechanism_raises_exactly_the_declared_findings(control: Control) -> None:
    results = effect_results(control)
    shown = "\n".join(str(result) for result in results if result.failed)
    assert findings(results) == control.declared, shown
    assert judge(control, results).detected


def test_a_wrong_declaration_is_not_detected() -> None:
    """The proof can fail: the same mechanism under another declared finding is not caught."""
    drop_in = CONTROLS[0]
    wrong = Declaration(
        name=drop_in.name,
        mechanism=drop_in.mechanism,
        finds=Finding(Check.NOT_ENABLED, Reason.NOT_ENABLED),
    )
    results = effect_results(drop_in)
    outcome = judge(wrong, results)
    assert not outcome.detected
    assert outcome.message.startswith("NOT DETECTED: no source.not-enabled (not-enabled); seen: ")
    assert findings(results) != wrong.declared
    # A false alarm: a failure where a control declares none.
    assert not judge(CORRECT_CONFIGURATION, results).detected


def test_each_control_is_caught_by_its_own_finding() -> None:
    declared = [control.finds for control in CONTROLS if control.finds is not None]
    assert len(declared) == len(set(declared))
    assert {control.name for control in CONTROLS}.isdisjoint(
        {RM_F.name, CORRECT_CONFIGURATION.name}
    )


def test_the_reset_covers_every_footprint() -> None:
    for control in (*CONTROLS, RM_F):
        assert control.footprint | EVERY_FOOTPRINT == EVERY_FOOTPRINT, control.name


GRACEFUL = "kill  15\ndie 0 \n"
"""What ``docker events --format EVENT_FORMAT`` records for a ``docker stop`` the server
survives: SIGTERM, then its own exit 0 (docker 28)."""
KILLED = "kill  9\ndie 137 \n"
"""What it records for ``docker rm -f`` of a running container: SIGKILL, then 137."""


def test_the_rm_f_mechanism_raises_exactly_its_finding() -> None:
    """The container control's evidence is Docker's event log: a graceful stop passes, the
    ``rm -f`` pre-start's SIGKILL is its finding and nothing else."""
    graceful = check_stopped_gracefully("start", "leftover", parse_events("c" * 64, GRACEFUL))
    assert graceful.ok, graceful
    killed = check_stopped_gracefully("start", "leftover", parse_events("c" * 64, KILLED))
    assert findings([graceful, killed]) == RM_F.declared
    assert judge(RM_F, [graceful, killed]).detected
    silent = check_stopped_gracefully("stop", "unit's", parse_events("c" * 64, "kill  15\n"))
    assert silent.finding == Finding(Check.GRACEFUL_STOP, Reason.NO_DIE_EVENT)

"""What the two negative-control modules share: the controls each runs, a run of them on one
guest that always writes its report, and the assertions every control must pass.

``test_controls_vm.py`` (pre-merge CI) runs ``PRE_MERGE`` after the scenario, on the scenario's
guest; ``test_controls_nightly_vm.py`` (the nightly tier, ``--nightly``) runs the rest and the
container path on a guest restored at the target. Together they run every control; which
control runs where is chosen by its cost (docs/ci-time.md): pre-merge CI keeps the ways a
setting is lost that the user's request names (a drop-in, an environment file or a unit that
lives only until the reboot), the banner and the engine's own config line, and a false alarm;
the restart, the flooded journal and the unit not enabled, the longest, are nightly since the
reference guest runs trixie.
"""

from __future__ import annotations

from pathlib import Path

from vmtests.driver.machine import Machine
from vmtests.report import write_controls_report
from vmtests.scenario.controls.catalogue import CONTROLS
from vmtests.scenario.controls.control import Control
from vmtests.scenario.controls.run import ControlsRun, run_all_controls
from vmtests.scenario.install.reference_switch import ReferenceSwitch

PRE_MERGE_NAMES = (
    "runtime drop-in",
    "banner without its switch",
    "engine runs without prefix caching",
    "env file under /run",
    "unrelated manager variable (false alarm)",
    "transient unit",
)
PRE_MERGE: tuple[Control, ...] = tuple(c for c in CONTROLS if c.name in PRE_MERGE_NAMES)
NIGHTLY: tuple[Control, ...] = tuple(c for c in CONTROLS if c.name not in PRE_MERGE_NAMES)
assert len(PRE_MERGE) == len(PRE_MERGE_NAMES), "a pre-merge control's name is not in CONTROLS"


def run_controls(
    machine: Machine,
    switch: ReferenceSwitch,
    controls: tuple[Control, ...],
    report_dir: Path,
    *,
    container: bool,
) -> ControlsRun:
    """The correct configuration, ``controls`` and (``container``) the container path on
    ``machine``, each reset to the target first; the report in ``report_dir`` is written even
    when a control fails to run."""
    run = ControlsRun()
    try:
        return run_all_controls(machine, switch, run, controls, container=container)
    finally:
        write_controls_report(run.report_outcomes, run.report_false_alarms, report_dir, run.correct)


def assert_detected(control: Control, run: ControlsRun) -> None:
    """On the guest the mechanism raised every finding ``control`` declares (its model on a
    recorded snapshot raises exactly those: test_control_effects.py); a false-alarm control
    raised nothing."""
    __tracebackhide__ = True
    outcome = run.outcomes[control.name]
    seen = "\n".join(str(failure) for failure in outcome.failures) or "(no failure at all)"
    expected = ", ".join(map(str, sorted(control.declared))) or "no failure at all"
    assert outcome.detected, f"{control.name}: expected {expected}; failures seen:\n{seen}"
    assert control.declared <= outcome.findings


def assert_own_messages(controls: tuple[Control, ...], run: ControlsRun) -> None:
    """Every one of ``controls`` ran, and each one's message comes from a failure with its own
    finding, which no other control of the catalogue declares."""
    __tracebackhide__ = True
    assert set(run.outcomes) == {control.name for control in controls}
    for control in controls:
        if control.finds is None:
            continue
        caught = [f for f in run.outcomes[control.name].failures if f.finding == control.finds]
        assert caught, control.name
        assert run.outcomes[control.name].message == caught[0].message
        others = [c.name for c in CONTROLS if c is not control and c.finds == control.finds]
        assert others == [], f"{control.name} shares its finding with {others}"

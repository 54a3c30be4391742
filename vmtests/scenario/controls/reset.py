"""Running one negative control on a prepared reference guest: reset, apply, (reboot,) check.

``reset_to_target`` is the one way back to the correct target between controls: it takes away
the union of every control's ``Footprint`` (``catalogue.EVERY_FOOTPRINT``), so a new control
only declares what it leaves behind. Where each control gets a guest of its own, restored in
the state it starts from (``vmtests.scenario.prepared``), a restore stands in for it
(``reset=False``); the reset stays the way back on one guest (``VMTESTS_SNAPSHOTS=off``, the
benchmark's comparison).
"""

from __future__ import annotations

import shlex
import time

from vmtests.contracts.serving import SERVING_CONTAINER, SERVING_UNIT
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest.stub_layer import set_stub_knobs
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.controls.catalogue import EVERY_FOOTPRINT
from vmtests.scenario.controls.control import (
    Control,
    ControlOutcome,
    Footprint,
    StartingPoint,
    judge,
)
from vmtests.scenario.controls.places import TRANSIENT_DIR
from vmtests.scenario.install.reference_switch import (
    UNIT_RESTART_TIMEOUT,
    ReferenceSwitch,
    install_units,
)
from vmtests.scenario.install.serving_unit import BACKEND
from vmtests.scenario.install.switching import wait_ready
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.results import CheckResult

SETTLE_TIMEOUT = 120.0


def reset_command(footprint: Footprint, stop_timeout: int) -> str:
    """One shell command that stops the serving unit and takes ``footprint`` away.

    A container is stopped gracefully and removed once stopped, never ``rm -f``. The files it
    removes are left to the next ``daemon-reload`` (each costs seconds under TCG).
    """
    quote = shlex.quote
    # A stopped transient unit that failed stays loaded (and blocks `systemctl enable`) until
    # its failure is reset.
    steps = [
        f"systemctl stop {SERVING_UNIT} 2>&1",
        f"systemctl reset-failed {SERVING_UNIT} 2>/dev/null",
    ]
    for name in sorted(footprint.containers):
        steps.append(
            f"if {BACKEND} container inspect {quote(name)} >/dev/null 2>&1; then "
            f"{BACKEND} stop -t {stop_timeout} {quote(name)}; {BACKEND} rm {quote(name)}; fi"
        )
    for path in sorted(footprint.pid_files):
        steps.append(f"if [ -s {quote(path)} ]; then kill $(cat {quote(path)}) 2>/dev/null; fi")
    for unit in sorted(footprint.transient_units):
        steps.append(
            f"rm -rf {quote(f'{TRANSIENT_DIR}/{unit}')} {quote(f'{TRANSIENT_DIR}/{unit}.d')}"
        )
    if footprint.masked_units:
        steps.append(
            f"systemctl unmask --no-reload {shlex.join(sorted(footprint.masked_units))} 2>&1"
        )
    if footprint.manager_variables:
        steps.append(
            f"systemctl unset-environment {shlex.join(sorted(footprint.manager_variables))}"
        )
    files = sorted(footprint.files | footprint.pid_files)
    if files:
        steps.append(f"rm -f {shlex.join(files)}")
    return "; ".join([*steps, "true"])


def reset_to_target(
    machine: Machine, switch: ReferenceSwitch, *, to: StartingPoint = "running"
) -> None:
    """Take away every control's footprint; then install the correct target configuration
    (``installed``, the unit stopped) and start it (``running``), or neither (``clean``: the
    control's own mechanism installs what it needs, and its first step reloads systemd)."""
    machine.succeed(
        reset_command(EVERY_FOOTPRINT, switch.target.stop_timeout), timeout=UNIT_RESTART_TIMEOUT
    )
    if EVERY_FOOTPRINT.stub_knobs:
        set_stub_knobs(machine)
    health = f"http://127.0.0.1:{switch.target.port}/health"
    machine.wait_until_succeeds("! curl -s -m 2 -o /dev/null %s", health, timeout=60)
    if to != "clean":
        install_units(machine, switch.target, "ready" if to == "running" else "reloaded")


def evaluate_machine(
    machine: Machine, switch: ReferenceSwitch, label: str
) -> tuple[Snapshot, list[CheckResult]]:
    """Snapshot the machine and run every single-snapshot check against the switch's profile.

    No control concerns the card (the scenario checks it), so the snapshot leaves out tt-smi.
    """
    snapshot = take_snapshot(
        machine, label, port=switch.target.port, container=SERVING_CONTAINER, card=False
    )
    return snapshot, evaluate_stage(switch.profile, snapshot)


def run_control(
    machine: Machine, switch: ReferenceSwitch, control: Control, *, reset: bool = True
) -> ControlOutcome:
    """Reset to the target, apply ``control``, (reboot,) check; report whether it was caught.

    ``reset=False``: ``machine`` is fresh in the state the control starts from (restored from
    a snapshot of it, ``vmtests.scenario.prepared.starting_state``), so nothing is undone first.
    """
    start = time.monotonic()
    with log.nested(f"negative control: {control.name}"):
        if reset:
            reset_to_target(machine, switch, to=control.starts_from)
        control.apply(machine, switch)
        label = "S1"
        if control.reboot:
            # Reboot a server that has started, as an operator would: a container still
            # starting up has no SIGTERM handler yet (PID 1 ignores the signal), so the
            # shutdown would wait out the stop timeout and then kill it.
            _settle(machine, switch)
            machine.reboot()
            label = "S2"
        # Let the server finish starting so that only the control's own fault shows.
        if control.settle:
            _settle(machine, switch)
        snapshot, results = evaluate_machine(machine, switch, label)
        outcome = judge(control, results, snapshot)
        outcome.seconds = time.monotonic() - start
        log.info(f"{'detected' if outcome.detected else 'NOT DETECTED'}: {outcome.message}")
    return outcome


def _settle(machine: Machine, switch: ReferenceSwitch) -> None:
    """Wait for the unit and /health; a control may keep them from coming up (a warning)."""
    try:
        wait_ready(machine, switch.target.port, SETTLE_TIMEOUT)
    except DriverError as error:
        log.warning(f"service not ready after applying the control: {error}")

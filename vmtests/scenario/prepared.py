"""The prepared states of the reference guest that the scenario, the negative controls and the
certification start from, restored from the snapshot cache (``vmtests.guest.snapshot_cache``):

- ``base_deployed``: booted and settled, then the reference switch's base step (the stub device
  layer, the image file, the base serving unit, serving): where the scenario's S0 begins;
- ``target_serving``: the base, then the profile's target installed and serving with no stub
  knobs set: where the certification begins, and each negative control that changes a
  running target; ``target_stopped``: the same with its unit stopped, where each other
  control begins (it installs and starts what it needs).

Each names everything its state comes from (the units and scripts it installs, the stub layer's
files, the stub image, the code that installs them) and records the state's snapshot rows on
the guest it saved (``witness_rows``), so that a restored guest can be compared with it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from vmtests.contracts.serving import SERVING_CONTAINER, SERVING_UNIT
from vmtests.driver.log import log
from vmtests.driver.qemu import QemuMachine
from vmtests.guest import REFERENCE_TARGET, firewall, stub_layer
from vmtests.guest.image import SETTLED
from vmtests.guest.snapshot_cache import (
    Preparation,
    PreparedGuest,
    code_digest,
    prepare_guest,
    snapshots_unavailable,
)
from vmtests.guest.stub_image import stub_image
from vmtests.guest.stub_layer import set_stub_knobs
from vmtests.guest.targets import machine_from_target
from vmtests.scenario.collection import collect, snapshot
from vmtests.scenario.controls.control import StartingPoint
from vmtests.scenario.controls.run import ControlsRun, control_jobs, run_all_controls
from vmtests.scenario.install import reference_switch, serving_unit
from vmtests.scenario.install.reference_switch import (
    UNIT_RESTART_TIMEOUT,
    ReferenceSwitch,
    ServingConfig,
    install_units,
)
from vmtests.tt_smi_parse import split_own_pid

WITNESS_LABEL = "prepared"


TRANSPARENT_HUGEPAGES = ("AnonHugePages", "ShmemHugePages", "FileHugePages")
"""meminfo lines of transparent hugepages, which the kernel collapses in the background."""


def witness_rows(machine: QemuMachine) -> dict[str, Any]:
    """The snapshot rows of the serving unit on ``machine``, without what differs between two
    moments of one boot: the journal's timestamps, the time the snapshot took, what is stamped
    on each answer (``/v1/models``' ``created`` and permission IDs, as vLLM makes them per
    request; tt-smi's ``time``) and the transparent hugepages (``TRANSPARENT_HUGEPAGES``)."""
    rows = collect.take_snapshot(
        machine, WITNESS_LABEL, container=SERVING_CONTAINER, card=True
    ).to_dict()
    rows.pop("seconds")
    for key in ("journal", "earlier_journal"):
        rows[key] = [{**line, "timestamp_us": 0} for line in rows[key]]
    for name in TRANSPARENT_HUGEPAGES:
        rows["hugepages"]["meminfo"].pop(name, None)
    rows["models"]["body"] = models_without_stamps(rows["models"]["body"])
    rows["tt_smi"]["body"] = tt_smi_without_stamps(rows["tt_smi"]["body"])
    return rows


def models_without_stamps(body: str) -> object:
    """``/v1/models`` without what vLLM stamps on each answer: every model's ``created``, every
    permission's ``id`` and ``created``."""
    document = _json(body)
    if isinstance(document, dict):
        for model in document.get("data", []):
            model.pop("created", None)
            for permission in model.get("permission", []):
                permission.pop("id", None)
                permission.pop("created", None)
    return document


def tt_smi_without_stamps(body: str) -> object:
    """``tt-smi -s`` without the time it was taken and the pid it ran as."""
    document = _json(split_own_pid(body)[1])
    if isinstance(document, dict):
        document.pop("time", None)
    return document


def _json(body: str) -> object:
    """``body`` parsed, or the text itself when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return body


def _installs(config: ServingConfig) -> dict[str, object]:
    """What installing ``config`` writes to the guest."""
    rendered = reference_switch.render_units(config)
    return {
        "units": rendered.units,
        "scripts": rendered.scripts,
        "firewall": firewall.firewall_files(config.firewall_tcp_ports),
    }


_CODE = code_digest(
    *(reference_switch, serving_unit, firewall, stub_layer, collect, snapshot),
    *(witness_rows, models_without_stamps, tt_smi_without_stamps),
)
"""The code that installs the states and takes their witness."""


def base_deployed(switch: ReferenceSwitch) -> Preparation:
    """The reference switch's base step on a settled guest (the same for every profile)."""
    switch.configure()
    return Preparation(
        f"base deployed ({switch.base_serving_profile})",
        switch.install_base,
        {
            "base": _installs(switch.base),
            "units source": switch.units_source,
            "stub layer": stub_layer.layer_files(),
            "stub image": stub_image().digest,
            "code": _CODE,
        },
        parent=SETTLED,
        witness=witness_rows,
    )


def target_serving(switch: ReferenceSwitch) -> Preparation:
    """The profile's target installed and serving on the base, no stub knobs set."""
    base = base_deployed(switch)

    def serve_target(machine: QemuMachine) -> None:
        set_stub_knobs(machine)
        install_units(machine, switch.installable(machine, switch.profile.serving_profile))

    return Preparation(
        f"{switch.profile.name} serving",
        serve_target,
        {"target": _installs(switch.target), "knobs": {}, "code": code_digest(serve_target)},
        parent=base,
        witness=witness_rows,
    )


def target_stopped(switch: ReferenceSwitch) -> Preparation:
    """The target installed, its unit stopped (its container gone): where a control that
    installs and starts what it needs begins, as after ``reset_to_target(to="clean")``."""
    serving = target_serving(switch)

    def stop_target(machine: QemuMachine) -> None:
        machine.succeed(f"systemctl stop {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)

    return Preparation(
        f"{switch.profile.name} installed, stopped",
        stop_target,
        {"code": code_digest(stop_target)},
        parent=serving,
        witness=witness_rows,
    )


def differences(fresh: object, restored: object, path: str = "") -> list[str]:
    """Where two witnesses differ (``path: fresh != restored``), for a failure message."""
    if isinstance(fresh, dict) and isinstance(restored, dict):
        return [
            line
            for key in sorted(set(fresh) | set(restored), key=str)
            for line in differences(fresh.get(key), restored.get(key), f"{path}.{key}")
        ]
    if isinstance(fresh, list) and isinstance(restored, list) and len(fresh) == len(restored):
        return [
            line
            for index, (a, b) in enumerate(zip(fresh, restored, strict=True))
            for line in differences(a, b, f"{path}[{index}]")
        ]
    return [] if fresh == restored else [f"{path or '.'}: {fresh!r} != {restored!r}"]


@contextmanager
def prepared_reference_guest(
    state_dir: Path, preparation: Preparation, name: str
) -> Iterator[PreparedGuest]:
    """A reference guest (``qemu:reference``, the contract's memory and vCPUs, the stub image's
    disk) started in ``preparation``'s state; closed at the end, whatever happens."""
    machine = machine_from_target(REFERENCE_TARGET, state_dir, name=name)
    assert isinstance(machine, QemuMachine)
    try:
        yield prepare_guest(machine, preparation)
    finally:
        machine.close()


def starting_state(switch: ReferenceSwitch, starts_from: StartingPoint) -> Preparation:
    """The prepared state a control that starts from ``starts_from`` begins in: the target
    serving (``running``), else installed and stopped (``installed``; ``clean`` too, where the
    control installs and starts what it needs itself, as after ``reset_to_target``)."""
    return target_serving(switch) if starts_from == "running" else target_stopped(switch)


def control_guests(
    state_dir: Path, switch: ReferenceSwitch
) -> Callable[[StartingPoint], AbstractContextManager[QemuMachine]]:
    """Guests for the negative controls, a new one for each call (``control-<n>``, its own
    state directory under ``state_dir``) in the state the control starts from
    (``starting_state``); closed, and their disk overlay removed, after use."""
    numbers = itertools.count(1)

    @contextmanager
    def fresh(starts_from: StartingPoint) -> Iterator[QemuMachine]:
        label = f"control-{next(numbers)}"
        preparation = starting_state(switch, starts_from)
        with prepared_reference_guest(state_dir / label, preparation, label) as prepared:
            try:
                yield prepared.machine
            finally:
                prepared.machine.close()
                prepared.machine.overlay.unlink(missing_ok=True)

    return fresh


def controls_jobs(
    state_dir: Path, switch: ReferenceSwitch, run: ControlsRun, *, lanes: int
) -> list[Callable[[], None]]:
    """Every control as jobs that fill ``run`` (for ``run_in_lanes`` with ``lanes`` lanes).

    With several lanes and snapshots, each control runs on a guest of its own restored in the
    state it starts from (``control_guests``), so the lanes share the work. Else one job runs
    every control on one guest prepared once (restored, or booted and deployed without
    snapshots) and reset to the target before each (``reset_to_target``): a restored guest
    translates again every program it runs, which costs a short control more than its reset
    (``docs/ci-time.md``), so one lane gains nothing from a restore per control."""
    why_not = snapshots_unavailable() or ("one lane" if lanes < 2 else "")
    if not why_not:
        return control_jobs(switch, run, fresh=control_guests(state_dir, switch))

    def on_one_guest() -> None:
        log.info(f"the controls share one guest, reset between them ({why_not})")
        serving = target_serving(switch)
        with prepared_reference_guest(state_dir / "controls", serving, "controls") as prepared:
            run_all_controls(prepared.machine, switch, run)

    return [on_one_guest]

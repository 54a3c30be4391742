"""A guest restored from the snapshot cache is the guest that was saved, carried on, and serves
as a freshly deployed one does.

The state the negative controls and the certification start from (cfx-llm2's target serving)
is restored into a fresh QEMU and compared, first with what the guest that was saved showed
right after the save (its witness, kept with the snapshot): the same snapshot rows, boot ID
included (a restore is not a reboot), journal timestamps aside; then what a restore must put
right: the clock, the console, the backdoor and the forwarded serving port. Second, with a
guest booted and deployed here without any snapshot (``VMTESTS_SNAPSHOTS=off``): a snapshot of
each gives the same check results and the same durable fields (what a reboot must keep, so
boot IDs, PIDs and timestamps aside). That S2 is still a real reboot on a restored guest is
shown by the scenario (``test_controls_vm.py``). Third, a negative control on a guest of its own,
restored in the state it starts from, as ``vmtests selftest`` runs each with several lanes: it
is detected with its own finding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from vmtests.contracts.serving import SERVING_CONTAINER, SERVING_PORT
from vmtests.contracts.settings import Settings
from vmtests.driver.http_probe import http_status
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.snapshot_cache import Preparation, PreparedGuest
from vmtests.profiles import load_profile
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.controls.catalogue import CONTROLS
from vmtests.scenario.controls.reset import run_control
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.compare import diff_snapshots
from vmtests.scenario.judgement.results import CheckResult
from vmtests.scenario.prepared import (
    control_guests,
    differences,
    prepared_reference_guest,
    target_serving,
    witness_rows,
)

pytestmark = [pytest.mark.vm, pytest.mark.nix]

PROFILE = "cfx-llm2"

CLOCK_TOLERANCE = 3.0
"""Seconds the restored guest's clock may differ from the host's (the boot set it from the
RTC, to the second)."""


@contextmanager
def restored_guest(state_dir: Path, preparation: Preparation) -> Iterator[PreparedGuest]:
    """A guest restored from ``preparation``'s snapshot (saved first when the cache is cold)."""
    with prepared_reference_guest(state_dir / "first", preparation, "first") as first:
        if first.restored:
            yield first
            return
    # A cold cache: that guest was deployed and saved just now, and this one is restored.
    with prepared_reference_guest(state_dir / "second", preparation, "second") as second:
        yield second


def test_a_restored_guest_is_the_saved_guest_carried_on(tmp_path: Path) -> None:
    preparation = target_serving(ReferenceSwitch(load_profile(PROFILE)))
    with restored_guest(tmp_path, preparation) as prepared:
        machine = prepared.machine
        assert prepared.restored, prepared.how
        assert prepared.witness is not None, "the snapshot keeps no witness of the saved guest"
        # The clock moved on by the time the guest spent saved; new journal lines are stamped
        # now.
        before = time.time()
        machine.succeed("logger -t vmtests-restore restored")
        after = time.time()
        entry = json.loads(machine.succeed("journalctl -b 0 -t vmtests-restore -n 1 -o json"))
        stamped = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        # Stamped while the host waited for the command, give or take the clock's tolerance.
        assert before - CLOCK_TOLERANCE < stamped < after + CLOCK_TOLERANCE, (
            before,
            stamped,
            after,
        )
        # The same snapshot rows as the freshly deployed guest showed, boot ID included.
        assert differences(prepared.witness, witness_rows(machine)) == []
        # The console kept the saved boot, from its kernel line, and follows the new QEMU.
        assert machine.boot_index == 0
        machine.wait_for_console_text(r"Linux version", timeout=5)
        machine.succeed("echo vmtests-console-after-restore > /dev/ttyS0")
        machine.wait_for_console_text("vmtests-console-after-restore", timeout=30)
        # The journal of this boot begins with the boot itself.
        first_line = machine.succeed("journalctl -b 0 -o cat --no-pager | head -n 1")
        assert first_line.startswith("Linux version"), first_line
        # The serving port answers through the new QEMU's forward.
        address = machine.host_address(SERVING_PORT)
        assert address is not None
        status, answer = http_status(*address, "/health")
        assert status == 200, answer


@pytest.mark.nightly
def test_a_restored_guest_serves_as_a_freshly_deployed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = load_profile(PROFILE)
    preparation = target_serving(ReferenceSwitch(profile))
    with monkeypatch.context() as without_snapshots:
        without_snapshots.setenv(Settings.variable("snapshots"), "off")
        with prepared_reference_guest(tmp_path / "fresh", preparation, "fresh") as fresh:
            assert not fresh.restored, fresh.how
            deployed = _snapshot(fresh.machine, "fresh")
    with restored_guest(tmp_path, preparation) as prepared:
        assert prepared.restored, prepared.how
        restored = _snapshot(prepared.machine, "restored")
    assert deployed.boot_id != restored.boot_id
    assert diff_snapshots(deployed, restored, profile) == []
    assert _rows(evaluate_stage(profile, deployed)) == _rows(evaluate_stage(profile, restored))
    assert [result for result in evaluate_stage(profile, restored) if result.failed] == []


def test_a_control_on_a_guest_of_its_own_is_detected(tmp_path: Path) -> None:
    """The control that starts from the target installed and stopped (``target_stopped``, the
    state no other test restores), on a guest restored there: nothing to reset first."""
    switch = ReferenceSwitch(load_profile(PROFILE))
    (control,) = [c for c in CONTROLS if c.starts_from == "installed"]
    with control_guests(tmp_path, switch)(control.starts_from) as guest:
        outcome = run_control(guest, switch, control, reset=False)
    seen = "\n".join(str(failure) for failure in outcome.failures) or "(no failure at all)"
    assert outcome.detected, f"{control.name}: failures seen:\n{seen}"
    assert control.declared <= outcome.findings, seen


def _snapshot(machine: QemuMachine, label: str) -> Snapshot:
    return take_snapshot(machine, label, container=SERVING_CONTAINER, card=True)


def _rows(results: list[CheckResult]) -> list[tuple[str, str, bool, str | None]]:
    """Each check's row (check, subject, outcome, reason), without its message (PIDs, times)."""
    return [(result.check, result.subject, result.ok, result.reason) for result in results]

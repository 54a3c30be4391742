"""Unit tests of the cross-stage checks: durable S1 == S2, reboot and restart really happened."""

from __future__ import annotations

from scenario_support import BOOT, EARLIER_BOOT, good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.profiles import load_profile
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.compare import (
    check_durable,
    check_rebooted,
    check_restarted,
    check_switched_system,
    diff_snapshots,
)
from vmtests.scenario.judgement.results import failures

CFX = load_profile("cfx-llm2")


def _next_boot(snapshot: Snapshot) -> Snapshot:
    """The same configuration after a reboot: new boot ID, PID and invocation."""
    snapshot.label = "S2"
    snapshot.boot_id = EARLIER_BOOT.replace("9", "7")
    snapshot.unit.properties.update(MainPID="321", InvocationID="f" * 32)
    snapshot.unit.properties["ExecStart"] = snapshot.unit.prop("ExecStart").replace(
        "pid=594", "pid=321"
    )
    assert snapshot.server is not None
    snapshot.server.pid = 321
    snapshot.server.environment["INVOCATION_ID"] = "f" * 32
    for line in snapshot.journal:
        line.boot_id, line.invocation_id = snapshot.boot_id, "f" * 32
    return snapshot


def test_same_configuration_after_reboot_is_durable() -> None:
    before, after = good_snapshot(), _next_boot(good_snapshot())
    assert diff_snapshots(before, after, CFX) == []
    assert failures(check_durable(before, after, CFX)) == []
    assert failures(check_rebooted(before, after)) == []


def test_lost_flag_shows_up_as_a_diff() -> None:
    before, after = good_snapshot(), _next_boot(good_snapshot())
    assert after.server is not None
    after.server.argv.remove("--no-async-scheduling")
    diffs = diff_snapshots(before, after, CFX)
    assert [d.field for d in diffs] == ["process.argv"]
    found = failures(check_durable(before, after, CFX))
    assert [r.subject for r in found] == ["process.argv"]
    assert "process.argv changed across the reboot" in found[0].message


def test_lost_banner_and_changed_digest() -> None:
    before, after = good_snapshot(), _next_boot(good_snapshot())
    after.journal = [line for line in after.journal if "SDPA" not in line.message]
    for line in after.journal:
        line.message = line.message.replace("digest=sha256:abab", "digest=sha256:cdcd")
    subjects = {r.subject for r in failures(check_durable(before, after, CFX))}
    assert {"banners", "module_banner", "digest"} <= subjects


def test_no_new_boot_is_caught() -> None:
    before = good_snapshot()
    after = good_snapshot(label="S2")
    found = failures(check_rebooted(before, after))
    assert [r.subject for r in found] == ["boot_id"]
    assert found[0].message.endswith(
        f"boot_id did not change ({BOOT} -> {BOOT}): no reboot happened"
    )


def test_a_missing_boot_id_is_not_taken_for_a_reboot() -> None:
    """A snapshot that could not read the boot ID proves nothing: the check must fail."""
    before, after = good_snapshot(), _next_boot(good_snapshot())
    after.boot_id = ""
    assert [r.subject for r in failures(check_rebooted(before, after))] == ["boot_id"]


def test_nixos_direct_boot_trap_is_caught() -> None:
    before, after = good_snapshot(), _next_boot(good_snapshot())
    before.generations = {"/run/current-system": "/nix/store/new"}
    after.generations = {"/run/booted-system": "/nix/store/old"}
    found = failures(check_rebooted(before, after))
    assert "not the switched generation /nix/store/new" in found[0].message


def test_switch_must_restart_the_unit() -> None:
    s0, s1 = good_snapshot(label="S0"), good_snapshot(label="S1")
    found = failures(check_restarted(s0, s1))
    assert "the switch did not restart tenstorrent-serving.service" in found[0].message
    s1.unit.properties["InvocationID"] = "e" * 32
    assert failures(check_restarted(s0, s1)) == []


def test_the_switch_must_activate_the_pre_built_system() -> None:
    """A NixOS switch that evaluated the target to another toplevel than the one pre-built into
    the image is caught, naming both; without an expected system nothing is checked."""
    prebuilt = "/nix/store/aaaa-nixos-system-vm-test-cfx-llm2-26.11.vmtests"
    s1 = good_snapshot(label="S1")
    s1.generations = {"/run/current-system": prebuilt}
    (held,) = check_switched_system(s1, prebuilt)
    assert held.ok
    assert held.message == f"runs the pre-built {prebuilt}"
    s1.generations = {"/run/current-system": "/nix/store/bbbb-nixos-system-vm-test-cfx-llm2"}
    (found,) = failures(check_switched_system(s1, prebuilt))
    assert found.finding == Finding(Check.SWITCHED_SYSTEM, Reason.OTHER_SYSTEM_ACTIVATED)
    assert found.message == (
        "after the switch (S1): runs /nix/store/bbbb-nixos-system-vm-test-cfx-llm2, not the "
        f"pre-built {prebuilt}: the switch activated another system than the one built on the "
        "host"
    )
    s1.generations = {}
    (found,) = failures(check_switched_system(s1, prebuilt))
    assert found.finding == Finding(Check.SWITCHED_SYSTEM, Reason.OTHER_SYSTEM_ACTIVATED)
    assert "runs no /run/current-system, not the pre-built" in found.message
    assert check_switched_system(s1, None) == []

"""The full persistence scenario on the reference guest: switch, reboot, prove persistence."""

from __future__ import annotations

from pathlib import Path

import pytest
from vm_support import REFERENCE_TARGET, reference_machine

from vmtests.contracts.serving import SERVING_CONTAINER
from vmtests.guest.firewall import FIREWALL_UNIT
from vmtests.profiles import load_profile
from vmtests.report import write_scenario_report
from vmtests.scenario.reference_switch import ReferenceSwitch
from vmtests.scenario.scenario import Scenario

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(190)]  # each profile


@pytest.mark.parametrize("profile_name", ["cfx-llm2", "resident"])
def test_scenario_passes_on_the_reference_guest(
    profile_name: str, tmp_path: Path, vmtests_report_dir: Path
) -> None:
    profile = load_profile(profile_name)
    with reference_machine(tmp_path / "machine", name=f"scenario-{profile_name}") as machine:
        scenario = Scenario(
            machine,
            profile,
            ReferenceSwitch(profile),
            target=REFERENCE_TARGET,
            base_profile=load_profile("baseline"),
            container=SERVING_CONTAINER,
        )
        try:
            scenario.run()
        finally:
            write_scenario_report(scenario.result, vmtests_report_dir / profile_name, machine)
        # The configuration's firewall came up at S2's boot, as NixOS's does, and the host's
        # probes of the serving port went through it.
        assert machine.execute(f"systemctl is-active {FIREWALL_UNIT}").stdout_text.strip() == (
            "active"
        )
    result = scenario.result
    assert result.failures == [], "\n".join(str(failure) for failure in result.failures)
    assert result.ok, result.error
    s0, s1, s2 = (result.snapshots[label] for label in ("S0", "S1", "S2"))
    # The base boot really lacked the profile (the switch changed something) ...
    assert any(c.stage == "S0" and not c.ok and c.informational for c in result.checks)
    # ... and the base profile held there, not by accident: it is checked, not informational.
    assert any(c.check.startswith("base profile.") and c.ok for c in result.checks)
    # S1 and S2 come from two boots and two starts of the unit.
    assert s0.boot_id == s1.boot_id != s2.boot_id
    assert len({s0.unit.invocation_id, s1.unit.invocation_id, s2.unit.invocation_id}) == 3
    assert all(line.boot_id == s2.boot_id for line in s2.current_lines())
    assert result.diffs == []
    assert (vmtests_report_dir / profile_name / "console-boot-1.log").exists()
    # The production shape ran: the serving process is the container, its stop timeout is the
    # module's, and the banners reached the unit's journal through the attached docker run.
    for snapshot in (s1, s2):
        assert snapshot.container is not None
        assert snapshot.container["stop_timeout"] == 60
        assert snapshot.process is not None
        assert snapshot.process.origin == "container"
        assert snapshot.launcher is not None
        assert snapshot.launcher.argv[:2] == ["docker", "run"]

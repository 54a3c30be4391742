"""A reference guest for the scenario's VM tests, serving the base and always closed, even on
failure or Ctrl-C; the persistence scenario on it, and what a passing scenario must show."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vmtests.driver.qemu import QemuMachine
from vmtests.guest import REFERENCE_TARGET
from vmtests.guest.firewall import FIREWALL_UNIT
from vmtests.profiles import load_profile
from vmtests.report import write_scenario_report
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.prepared import base_deployed, prepared_reference_guest
from vmtests.scenario.runner.scenario import Scenario


@contextmanager
def base_guest(state_dir: Path, profile_name: str) -> Iterator[QemuMachine]:
    """A reference guest (the contract's memory and vCPUs) serving the base configuration,
    restored from the snapshot cache when it was saved (``vmtests.scenario.prepared``); the
    scenario on it finds the base served (S0 is taken there) and switches and reboots for real.
    """
    switch = ReferenceSwitch(load_profile(profile_name))
    name = f"scenario-{profile_name}"
    with prepared_reference_guest(state_dir, base_deployed(switch), name) as prepared:
        yield prepared.machine


def run_scenario(machine: QemuMachine, profile_name: str, report_dir: Path) -> Scenario:
    """Run the persistence scenario for ``profile_name`` on ``machine`` (from the baseline,
    through the reference switch) and write its report to ``report_dir``, whatever happens."""
    profile = load_profile(profile_name)
    scenario = Scenario(
        machine,
        profile,
        ReferenceSwitch(profile),
        target=REFERENCE_TARGET,
        base_profile=load_profile("baseline"),
    )
    try:
        scenario.run()
    finally:
        write_scenario_report(scenario.result, report_dir, machine)
    return scenario


def assert_scenario_passed(scenario: Scenario, machine: QemuMachine, report_dir: Path) -> None:
    """The scenario passed, and for the right reasons: the base lacked the profile, S1 and S2
    come from two boots and three starts, and the production shape (the container) ran."""
    # The configuration's firewall came up at S2's boot, as NixOS's does, and the host's
    # probes of the serving port went through it.
    assert machine.execute(f"systemctl is-active {FIREWALL_UNIT}").stdout_text.strip() == "active"
    result = scenario.result
    assert result.failures == [], "\n".join(str(failure) for failure in result.failures)
    assert result.ok, result.error
    s0, s1, s2 = (result.snapshots[label] for label in ("S0", "S1", "S2"))
    # The base boot really lacked the profile (the switch changed something) ...
    assert any(c.stage == "S0" and not c.ok and c.informational for c in result.checks)
    # ... and the base profile held there, not by accident: it is checked, not informational.
    assert any(c.base and c.check.startswith("profile.") and c.ok for c in result.checks)
    # S1 and S2 come from two boots and two starts of the unit.
    assert s0.boot_id == s1.boot_id != s2.boot_id
    assert len({s0.unit.invocation_id, s1.unit.invocation_id, s2.unit.invocation_id}) == 3
    assert all(line.boot_id == s2.boot_id for line in s2.current_lines())
    assert result.diffs == []
    assert (report_dir / "console-boot-1.log").exists()
    # The production shape ran: the serving process is the container, its stop timeout is the
    # module's, and the banners reached the unit's journal through the attached docker run.
    for snapshot in (s1, s2):
        assert snapshot.container is not None
        assert snapshot.container.stop_timeout == 60
        assert snapshot.server is snapshot.container.process
        assert snapshot.server.origin == "container"
        assert snapshot.main_process is not None
        assert snapshot.main_process.argv[:2] == ["docker", "run"]

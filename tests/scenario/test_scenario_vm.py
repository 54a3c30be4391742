"""The full persistence scenario on a fresh reference guest: switch, reboot, prove persistence.

The first selftest profile's scenario (cfx-llm2) runs in ``test_controls_vm.py``, on the guest
the negative controls then use, as ``vmtests selftest`` runs them; the other profiles run here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vm_support import assert_scenario_passed, reference_machine, run_scenario

from vmtests.cli import SELFTEST_PROFILES

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(190)]  # each profile


# The first runs in test_controls_vm.py, on the guest the controls then use.
@pytest.mark.parametrize("profile_name", SELFTEST_PROFILES[1:])
def test_scenario_passes_on_the_reference_guest(
    profile_name: str, tmp_path: Path, vmtests_report_dir: Path
) -> None:
    report_dir = vmtests_report_dir / profile_name
    with reference_machine(tmp_path / "machine", name=f"scenario-{profile_name}") as machine:
        scenario = run_scenario(machine, profile_name, report_dir)
        assert_scenario_passed(scenario, machine, report_dir)

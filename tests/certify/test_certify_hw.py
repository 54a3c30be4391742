"""The certification on a real P150 host: marked ``hw``, runs only with ``--hw-opt-in`` and an
``ssh://`` ``--target`` (the plugin skips it otherwise). Same code as ``vmtests certify``, with
the host's settings as it takes them (the target's options, ``--host-config``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests.certify.run import certify
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.install.switching import NoSwitch

pytestmark = pytest.mark.hw


def test_hardware_certifies(
    vmtests_machine: Machine,
    vmtests_profile: Profile,
    vmtests_target: str,
    vmtests_report_dir: Path,
    vmtests_settings: Settings,
) -> None:
    vmtests_machine.start()
    result = certify(
        vmtests_machine,
        vmtests_profile,
        target=vmtests_target,
        switcher=NoSwitch(),  # no A/B here: `vmtests certify --ab ... --switch-command` does it
        report_dir=vmtests_report_dir / "certify",
        settings=vmtests_settings,
    )
    assert result.exit_status == 0, result.verdict

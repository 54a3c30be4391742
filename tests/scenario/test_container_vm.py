"""The container path on the reference guest: a leftover container is stopped gracefully by
the module's pre-start and never killed; oci-containers' own ``docker rm -f`` pre-start is
caught by the same check (exit code 137)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vm_support import reference_machine

from vmtests.driver.qemu import QemuMachine
from vmtests.profiles import load_profile
from vmtests.scenario.container_stop import CHECK, leftover_then_start
from vmtests.scenario.reference_switch import ReferenceSwitch

pytestmark = [pytest.mark.vm, pytest.mark.nix]


@pytest.fixture(scope="module")
def prepared(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[QemuMachine, ReferenceSwitch]]:
    """One guest with the stub layer, the image file and the base serving unit installed."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    with reference_machine(Path(tmp_path_factory.mktemp("container")), name="container") as machine:
        machine.start()
        switch.prepare_base(machine)
        yield machine, switch


def test_leftover_container_is_stopped_gracefully(
    prepared: tuple[QemuMachine, ReferenceSwitch],
) -> None:
    machine, switch = prepared
    results = leftover_then_start(machine, switch)
    assert [r.check for r in results] == [CHECK, CHECK]
    assert all(r.ok for r in results), "\n".join(map(str, results))
    assert "exit code 0" in results[0].message
    assert "15" in results[0].message  # SIGTERM


def test_oci_containers_rm_f_pre_start_is_caught(
    prepared: tuple[QemuMachine, ReferenceSwitch],
) -> None:
    machine, switch = prepared
    leftover, unit_stop = leftover_then_start(machine, switch, graceful_pre_start=False)
    assert not leftover.ok
    assert "was killed: exit code 137" in leftover.message
    assert unit_stop.ok, str(unit_stop)  # the unit's own stop stays graceful

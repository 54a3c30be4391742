"""The stub device layer in the reference guest: installed, used by the server, kept by a reboot."""

from __future__ import annotations

import json

import pytest
from stub_support import PRODUCTION_ARGS, PRODUCTION_ENV

from vmtests.contracts.serving import DEVICE
from vmtests.driver.machine import Machine
from vmtests.guest import stub_layer
from vmtests.stub import device

GUEST_PORT = 8000
PROBE_UNIT = "stub-probe"


@pytest.fixture
def guest(shared_reference_guest: Machine) -> Machine:
    """The session's shared reference guest: the stub layer is installed next to the rest."""
    return shared_reference_guest


def check_device_layer(machine: Machine) -> None:
    """The node is a 0666 char device with the stub major, and tt-smi reports one p150a."""
    stat = machine.succeed(f"stat -c '%F %a %t:%T' {DEVICE}").strip()
    assert stat == f"character special file 666 {device.STUB_MAJOR:x}:0"
    snapshot = json.loads(stub_layer.check_stub_device_layer(machine))
    assert snapshot["host_info"]["Driver"] == f"TT-KMD {device.STUB_DRIVER_VERSION}"
    assert [board["board_info"]["board_type"] for board in snapshot["device_info"]] == ["p150a"]


@pytest.mark.nightly
@pytest.mark.vm
def test_install_serve_and_survive_a_reboot(guest: Machine) -> None:
    stub_layer.install_stub_device_layer(guest)
    stub_layer.install_stub_device_layer(guest)  # idempotent: a second run changes nothing
    check_device_layer(guest)
    features_json = f"{stub_layer.GUEST_PACKAGE}/contracts/features.json"
    guest.succeed("test -f %s && test ! -L %s", features_json, features_json)

    setenv = [f"--setenv={name}={value}" for name, value in PRODUCTION_ENV.items()]
    args = [*PRODUCTION_ARGS, "--port", str(GUEST_PORT)]
    guest.succeed(
        "systemd-run --unit=%s %s %s %s", PROBE_UNIT, setenv, stub_layer.SERVER_PATH, args
    )
    guest.wait_for_open_port(GUEST_PORT, timeout=120)
    guest.succeed(f"curl -sf http://127.0.0.1:{GUEST_PORT}/health")
    journal = guest.journal(unit=PROBE_UNIT)
    for banner in ("qwen36: SDPA streaming ACTIVE", "qwen36: merge batch guard ACTIVE"):
        assert banner in journal
    guest.succeed(f"systemctl stop {PROBE_UNIT}", timeout=90)
    assert "Finished server process" in guest.journal(unit=PROBE_UNIT)

    guest.reboot()
    check_device_layer(guest)

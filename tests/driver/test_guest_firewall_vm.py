"""The reference guest's firewall drops what NixOS's drops (``vmtests.guest.firewall``).

NixOS turns its firewall on by default, and the driver asks ``/health`` through the forwarded
port, from outside the guest. A configuration that leaves the serving port closed must time out
on the reference guest as it would in the NixOS VM, while the same server still answers inside
the guest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from vmtests.contracts.instrumentation import SSH_PORT
from vmtests.contracts.serving import SERVING_PORT
from vmtests.driver.errors import WaitTimeout
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.firewall import APPLY, FIREWALL_UNIT, firewall_files
from vmtests.guest.image import SETTLED

pytestmark = pytest.mark.vm

PROBE_UNIT = "vmtests-firewall-probe"


def _apply(guest: QemuMachine, tcp_ports: Sequence[int] | None) -> None:
    """Install the firewall for ``tcp_ports`` as the reference switch does, and apply it."""
    guest.write_files(firewall_files(tcp_ports))
    guest.succeed(
        f"systemctl enable --no-reload {FIREWALL_UNIT} 2>&1 && systemctl daemon-reload && {APPLY}"
    )


def test_a_closed_serving_port_times_out_from_the_host(
    reference_guest: Callable[..., QemuMachine],
) -> None:
    guest = reference_guest(name="firewall", forward_ports=(SERVING_PORT,), preparation=SETTLED)
    guest.succeed(
        f"systemd-run --unit {PROBE_UNIT} /usr/bin/python3 -m http.server --bind 0.0.0.0 "
        f"{SERVING_PORT}"
    )
    guest.wait_for_http_ok(SERVING_PORT, "/", timeout=120, unit=PROBE_UNIT)  # no firewall yet

    _apply(guest, (SSH_PORT,))
    assert guest.succeed(f"systemctl is-active {FIREWALL_UNIT}").strip() == "active"
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_http_ok(SERVING_PORT, "/", timeout=10, unit=PROBE_UNIT)
    assert f"127.0.0.1:{SERVING_PORT}/" in str(caught.value)
    # Only connections from outside are dropped: on lo the server still answers.
    guest.succeed(f"curl -sf -m 5 -o /dev/null http://127.0.0.1:{SERVING_PORT}/")

    _apply(guest, (SSH_PORT, SERVING_PORT))
    guest.wait_for_http_ok(SERVING_PORT, "/", timeout=60, unit=PROBE_UNIT)

    _apply(guest, (SSH_PORT,))
    _apply(guest, None)  # a configuration with the firewall off removes the rules
    guest.wait_for_http_ok(SERVING_PORT, "/", timeout=60, unit=PROBE_UNIT)

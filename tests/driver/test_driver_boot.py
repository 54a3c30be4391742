"""Boot failures and acceleration: hangs end within the boot timeout; auto falls back to TCG."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from vmtests.driver.errors import WaitTimeout
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.image import ReferenceImage

pytestmark = pytest.mark.vm


def test_guest_that_never_boots_fails_within_boot_timeout_with_console_tail(
    reference_image: ReferenceImage, tmp_path: Path
) -> None:
    # The kernel boots, the initramfs cannot find the root device, and the backdoor never
    # comes up: the wait must end at the boot timeout and show why.
    guest = QemuMachine(
        name="never-boots",
        state_dir=tmp_path,
        kernel=reference_image.kernel,
        initrd=reference_image.initrd,
        append=reference_image.append.replace("root=/dev/vda", "root=/dev/vmtests-missing"),
        base_disk=reference_image.disk,
        accel="tcg",
        boot_timeout=30,
    )
    with pytest.raises(WaitTimeout) as caught, guest:
        pass
    message = str(caught.value)
    assert "backdoor ready line" in message
    waited = float(re.search(r"timed out after ([0-9.]+)s", message).group(1))  # type: ignore[union-attr]
    assert waited <= 31  # the boot timeout ended the wait, not the 300 s default
    # The console tail shows where it hangs: the initramfs polling for the missing root device.
    assert "Running /scripts/local-block" in message
    assert not guest.process_running


def test_qemu_that_cannot_start_reports_its_stderr(
    reference_image: ReferenceImage, tmp_path: Path
) -> None:
    guest = QemuMachine(
        name="bad-kernel",
        state_dir=tmp_path,
        kernel=tmp_path / "no-such-kernel",
        initrd=reference_image.initrd,
        append="",
        base_disk=reference_image.disk,
        accel="tcg",
        boot_timeout=60,
    )
    with pytest.raises(Exception, match="no-such-kernel") as caught, guest:
        pass
    assert "QEMU" in str(caught.value)
    assert not guest.process_running


@pytest.mark.skipif(not os.access("/dev/kvm", os.R_OK | os.W_OK), reason="no usable /dev/kvm")
def test_accel_auto_falls_back_to_tcg_when_kvm_fails(
    reference_guest: Callable[..., QemuMachine], capsys: pytest.CaptureFixture[str]
) -> None:
    from vmtests.driver import qemu  # noqa: PLC0415

    qemu._KVM_VERDICT.clear()  # probe for real even if an earlier test already did
    guest = reference_guest(name="auto", accel="auto", kvm_probe_timeout=10)
    assert guest.succeed("echo up") == "up\n"
    logged = capsys.readouterr().err
    if guest.accel_used == "kvm":
        assert "restarting under TCG" not in logged
    else:
        # On hosts where KVM opens but hangs or aborts (ours), the fallback must be loud.
        assert guest.accel_used == "tcg"
        assert "WARNING" in logged
        assert "restarting under TCG (accel=auto)" in logged

"""Boot failures and acceleration: hangs end within the boot timeout; auto falls back to TCG."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from vmtests.driver import accel, qemu_launch
from vmtests.driver.errors import WaitTimeout
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.image import ReferenceImage, start_reference_guest
from vmtests.profiles import load_profile
from vmtests.report import write_scenario_report
from vmtests.scenario.runner.scenario import ScenarioResult

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
    # The console tail shows where it hangs: its last line is the console's last line, which
    # is the initramfs polling for the missing root device once the boot got that far (on a
    # loaded host it may still be in the kernel after 30 s: docs/ci-time.md).
    console = [line for line in guest.console_text(0).splitlines() if line.strip()]
    assert console, "the console recorded nothing"
    assert console[-1].strip() in message
    if any("Running /scripts/local-block" in line for line in console):
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


# A QEMU that misbehaves only under KVM, as QEMU does on hosts where /dev/kvm opens but guests
# hang at kernel entry or QEMU aborts on an MSR. It runs the real QEMU under TCG otherwise, so
# the test does not depend on the host's KVM at all.
BROKEN_KVM_QEMU = """#!/bin/bash
real=$(command -v qemu-system-x86_64)
[ "$1" = --version ] && exec "$real" --version
args=(); kvm=0
for arg in "$@"; do
  if [ "$arg" = kvm ]; then kvm=1; args+=(tcg); else args+=("$arg"); fi
done
if [ "$kvm" = 1 ]; then
  case "$VMTESTS_FAKE_KVM" in
    abort) echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x0" >&2; exit 1 ;;
    denied)  # QEMU's own words when /dev/kvm cannot be opened (checked against QEMU 7.2)
      echo "Could not access KVM kernel module: Permission denied" >&2
      echo "qemu-system-x86_64: failed to initialize kvm: Permission denied" >&2; exit 1 ;;
    hang) exec "$real" "${args[@]}" -S ;;  # the vCPU never runs: no kernel line, ever
  esac
fi
exec "$real" "${args[@]}"
"""


@pytest.fixture
def broken_kvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """QEMU is the wrapper above, /dev/kvm counts as usable, and verdicts go to a temp file."""
    wrapper = tmp_path / "qemu-broken-kvm"
    wrapper.write_text(BROKEN_KVM_QEMU)
    wrapper.chmod(0o755)
    verdict = tmp_path / "kvm-verdict.json"
    monkeypatch.setattr(qemu_launch, "QEMU_BINARY", str(wrapper))
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    monkeypatch.setattr(accel, "verdict_file", lambda: verdict)
    return verdict


@pytest.mark.nightly
def test_accel_auto_falls_back_to_tcg_when_kvm_hangs_and_remembers_it(
    reference_image: ReferenceImage,
    broken_kvm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("VMTESTS_FAKE_KVM", "hang")
    guest = start_reference_guest(
        tmp_path / "probe", name="auto", accel="auto", image=reference_image, kvm_probe_timeout=3
    )
    try:
        assert guest.accel_used == "tcg"
        assert guest.succeed("echo up") == "up\n"
        result = ScenarioResult(load_profile("cfx-llm2"), "qemu:reference", "not switched")
        paths = write_scenario_report(result, tmp_path / "report", guest)
    finally:
        guest.close()
    logged = capsys.readouterr().err
    assert "WARNING: auto: no kernel output under KVM within 3s; restarting under TCG" in logged
    # The scenario's reports say which accelerator ran, which was asked for, and why.
    why = "no kernel output under KVM within 3s; restarted under TCG"
    reported = json.loads(paths["json"].read_text())["accelerator"]
    assert reported == {"requested": "auto", "used": "tcg", "why": why}
    assert f"Accelerator: tcg (asked for auto: {why})" in paths["markdown"].read_text()
    stored = json.loads(broken_kvm.read_text())
    assert stored["usable"] is False
    assert stored["key"] == accel.host_key(qemu_launch.QEMU_BINARY)

    # The next machine (in this process or any other) reads the verdict and does not probe.
    later = unstarted_guest(reference_image, tmp_path / "later")
    assert later.choose_accel() == "tcg"
    assert "KVM failed on this host before (no kernel output" in capsys.readouterr().err
    assert not later.process_running


@pytest.mark.parametrize(
    "failure",
    [
        ("abort", "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x0"),
        # A builder that cannot open /dev/kvm (a Nix sandbox without the kvm group).
        ("denied", "qemu-system-x86_64: failed to initialize kvm: Permission denied"),
    ],
    ids=["abort", "denied"],
)
def test_accel_auto_falls_back_at_once_when_qemu_fails_under_kvm(
    reference_image: ReferenceImage,
    broken_kvm: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: tuple[str, str],
) -> None:
    mode, said = failure
    monkeypatch.setenv("VMTESTS_FAKE_KVM", mode)
    guest = unstarted_guest(reference_image, broken_kvm.parent / "state")
    assert guest.choose_accel() == "tcg"
    logged = capsys.readouterr().err
    assert (
        "QEMU failed under KVM: auto: QEMU exited before connecting its serial console "
        f"(QEMU said: {said}); restarting under TCG (accel=auto)"
    ) in logged
    assert guest.acceleration["why"].endswith(f"(QEMU said: {said}); restarted under TCG")
    assert json.loads(broken_kvm.read_text())["usable"] is False
    assert not guest.process_running


def test_a_stale_or_foreign_verdict_is_ignored(broken_kvm: Path) -> None:
    key = accel.host_key(qemu_launch.QEMU_BINARY)
    accel.remember(key, False, "seen long ago")
    assert accel.remembered(key) is not None
    assert accel.remembered(key, now=time.time() + accel.VERDICT_TTL + 1) is None
    data = json.loads(broken_kvm.read_text())
    broken_kvm.write_text(json.dumps({**data, "key": "another-host|6.1|QEMU 7"}))
    assert accel.remembered(key) is None


def unstarted_guest(image: ReferenceImage, state_dir: Path) -> QemuMachine:
    """A reference guest object that has not been started."""
    return QemuMachine(
        name="auto",
        state_dir=state_dir,
        kernel=image.kernel,
        initrd=image.initrd,
        append=image.append,
        base_disk=image.disk,
        accel="auto",
        kvm_probe_timeout=3,
    )

"""vCPUs come from the instrumentation contract: the reference guest gets ``-smp <cpus>`` and a
NixOS VM keeps the ``-smp`` its run script takes from ``virtualisation.cores`` (nixpkgs
nixos/modules/virtualisation/qemu-vm.nix), which hosts/vm-test/common.nix sets from the same
contract. No QEMU is started."""

from __future__ import annotations

from pathlib import Path

from vmtests.contracts.instrumentation import GUEST_CPUS
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_launch import Sockets


def _smp(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-smp"]


def _sockets(tmp_path: Path) -> Sockets:
    return Sockets(serial=tmp_path / "s", backdoor=tmp_path / "b", qmp=tmp_path / "q")


def test_a_nixos_vm_keeps_the_cores_of_its_configuration(tmp_path: Path) -> None:
    machine = QemuMachine("nixos", tmp_path / "state", run_script=tmp_path / "run-vm-test-vm")
    spec = machine._spec("tcg", _sockets(tmp_path))
    assert _smp(spec.argv) == [], spec.argv


def test_the_reference_guest_gets_the_contract_cpus(tmp_path: Path) -> None:
    machine = QemuMachine(
        "reference",
        tmp_path / "state",
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        base_disk=tmp_path / "disk.qcow2",
    )
    spec = machine._spec("tcg", _sockets(tmp_path))
    assert _smp(spec.argv) == [str(GUEST_CPUS)], spec.argv


def test_an_explicit_cpu_count_still_wins(tmp_path: Path) -> None:
    machine = QemuMachine(
        "nixos", tmp_path / "state", run_script=tmp_path / "run-vm-test-vm", cpus=1
    )
    assert _smp(machine._spec("tcg", _sockets(tmp_path)).argv) == ["1"]

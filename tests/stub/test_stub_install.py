"""The stub device layer's installers: the staged package, the tmpfiles rules, the Nix module."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vmtests.contracts.paths import REPO_ROOT
from vmtests.guest import stub_image, stub_layer
from vmtests.stub import device, knobs

NIX_MODULE = REPO_ROOT / "modules" / "tenstorrent-stub.nix"


def test_staged_package_resolves_features_json(tmp_path: Path) -> None:
    staged = stub_image.copy_package(tmp_path)
    copied = staged / "contracts" / "features.json"
    assert (REPO_ROOT / "vmtests" / "contracts" / "features.json").is_symlink()
    assert copied.is_file()
    assert not copied.is_symlink()
    assert copied.read_text() == (REPO_ROOT / "modules" / "serving" / "features.json").read_text()
    assert (staged / "stub" / "server.py").is_file()
    assert not list(staged.rglob("__pycache__"))


def test_staged_package_holds_what_the_nixos_stub_layer_holds(tmp_path: Path) -> None:
    staged = stub_image.copy_package(tmp_path)
    assert sorted(path.name for path in staged.iterdir()) == ["__init__.py", "contracts", "stub"]
    module = NIX_MODULE.read_text()
    for part in ("__init__.py", "stub", "contracts"):
        assert f"../vmtests/{part}" in module, part  # modules/tenstorrent-stub.nix copies it


def test_tmpfiles_rules_create_a_char_device_in_the_local_major_range() -> None:
    rules = device.tmpfiles_rules()
    node_rule = next(rule for rule in rules if rule.startswith("c "))
    kind, path, mode, *_, numbers = node_rule.split()
    assert (kind, path, mode) == ("c", "/dev/tenstorrent/0", "0666")
    major, minor = (int(part) for part in numbers.split(":"))
    assert 120 <= major <= 127  # char local/experimental, outside the dynamic 234-254
    assert minor == 0
    assert stub_layer.tmpfiles_conf().count("\n") == len(rules) + 1


def test_wrappers_run_the_installed_package() -> None:
    script = stub_layer.wrapper_script("vmtests.stub.tt_smi")
    assert script.startswith("#!/bin/sh\n")
    assert f"PYTHONPATH={stub_layer.GUEST_PYTHONPATH}" in script
    assert 'exec python3 -m vmtests.stub.tt_smi "$@"' in script


def test_nix_module_declares_the_same_device_layer() -> None:
    """The Nix module cannot import Python: this keeps its rules identical to device.py."""
    text = NIX_MODULE.read_text()
    for rule in device.tmpfiles_rules():
        assert rule in text, f"modules/tenstorrent-stub.nix lacks the tmpfiles rule {rule!r}"


@pytest.mark.nix
def test_nix_module_parses() -> None:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate not found: apt-get install nix-bin")
    result = subprocess.run(
        [nix, "--parse", str(NIX_MODULE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def _evaluate_stub_module(**arguments: bool) -> dict[str, object]:
    from vmtests.nixcore import find_nixpkgs_lib  # noqa: PLC0415
    from vmtests.nixrun import evaluate_json, nix_value  # noqa: PLC0415

    nixpkgs_lib = find_nixpkgs_lib()
    if nixpkgs_lib is None:
        pytest.skip("no nixpkgs lib (see tests/eval/conftest.py for where to put one)")
    extra = " ".join(f"{name} = {nix_value(value)};" for name, value in arguments.items())
    expression = (
        f"import {nix_value(Path(__file__).with_name('stub-module-eval.nix'))} "
        f"{{ lib = import {nix_value(nixpkgs_lib)}; {extra} }}"
    )
    result: dict[str, object] = evaluate_json(expression)
    return result


@pytest.mark.nix
def test_nix_module_wires_the_stub_image_into_the_serving_module() -> None:
    evaluated = _evaluate_stub_module(enable=True)
    assert evaluated["failedAssertions"] == []
    assert evaluated["image"] == "vmtests-stub-vllm:latest"
    assert evaluated["imageFile"] == "vmtests-stub-vllm.tar.gz"
    assert evaluated["tmpfiles"] == device.tmpfiles_rules()
    entrypoint = evaluated["entrypoint"]
    assert isinstance(entrypoint, list)
    assert entrypoint[1:] == ["-m", "vmtests.stub.server"]
    assert evaluated["packages"] == ["tt-smi"]
    # The knobs file reaches the container at the reference guest's path; the tmpfiles rules
    # above create it writable and empty, and never overwrite it.
    assert evaluated["containerEnvFiles"] == [knobs.KNOBS_FILE]
    assert f"f {knobs.KNOBS_FILE} 0644 root root -" in evaluated["tmpfiles"]
    assert evaluated["knobsFile"] is None  # not an environment.etc file: that is rewritten
    assert knobs.KNOBS_FILE.startswith("/etc/")


@pytest.mark.nix
def test_nix_module_evaluates_without_the_serving_module() -> None:
    """``nixosModules.tenstorrent-stub`` alone: the device layer, and nothing set on a serving
    module that is not there (an undeclared option would fail the evaluation)."""
    alone = _evaluate_stub_module(enable=True, servingModule=False)
    assert alone["failedAssertions"] == []
    assert alone["tmpfiles"] == device.tmpfiles_rules()
    assert alone["image"] is None
    assert alone["containerEnvFiles"] == []


@pytest.mark.nix
def test_nix_module_is_inert_when_disabled_and_refuses_the_real_driver() -> None:
    disabled = _evaluate_stub_module(enable=False)
    assert disabled["imageFile"] is None
    assert disabled["tmpfiles"] == []
    both = _evaluate_stub_module(enable=True, realDriver=True)
    failed = both["failedAssertions"]
    assert isinstance(failed, list)
    assert len(failed) == 1, failed
    message = str(failed[0])
    assert message.startswith(
        "hardware.tenstorrent-stub and hardware.tenstorrent (the real tt-kmd) exclude each other"
    )
    assert "hardware.tenstorrent-stub.enable = false" in message  # it says what to change

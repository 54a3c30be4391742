"""The instrumentation contract: one definition, rendered identically for Debian and NixOS."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vmtests.contracts import instrumentation as contract
from vmtests.driver.qemu import QemuMachine
from vmtests.guest import toolpath
from vmtests.guest.image import _rendered_files
from vmtests.nixcore import find_nixpkgs_lib

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "modules" / "test-instrumentation.nix"

# Just enough NixOS option declarations for the module to evaluate with lib.evalModules.
EVAL = """
let
  lib = import @LIB@;
  # Derivation-shaped (types.package accepts them); JSON shows their outPath.
  fakeAt = path: { type = "derivation"; name = baseNameOf path; outPath = path; };
  fakePackage = attr: fakeAt "/fake/${attr}";
  pkgs = lib.genAttrs @TOOL_PACKAGES@ fakePackage // {
    bash = fakePackage "bash";
    writeScript = name: text: text;
  };
  nixosStubs = { lib, ... }: with lib; {
    options = {
      boot.kernelParams = mkOption { type = types.listOf types.str; default = [ ]; };
      boot.kernelModules = mkOption { type = types.listOf types.str; default = [ ]; };
      boot.consoleLogLevel = mkOption { type = types.int; default = 4; };
      systemd.services = mkOption { type = types.attrsOf types.anything; default = { }; };
      services.openssh = mkOption { type = types.anything; default = { }; };
      users.users = mkOption { type = types.attrsOf types.anything; default = { }; };
      services.journald.settings = mkOption { type = types.anything; default = { }; };
      assertions = mkOption { type = types.listOf types.anything; default = [ ]; };
    };
  };
  evalWith = extra: lib.evalModules {
    specialArgs = { inherit pkgs; };
    modules = [
      nixosStubs
      @MODULE@
      { vmtests.instrumentation = { enable = true; authorizedKeys = [ "ssh-ed25519 AAAAtest" ]; }; }
      extra
    ];
  };
  failed = config: map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  c = (evalWith { }).config;
  stub = fakeAt "/stub/tt-smi";
  supplied = (evalWith { vmtests.instrumentation.toolPackages.tt-smi = stub; }).config;
  misspelt = (evalWith { vmtests.instrumentation.toolPackages.tt_smi = stub; }).config;
in {
  failedAssertions = failed c;
  suppliedPath = supplied.systemd.services.vmtests-backdoor.path;
  misspeltAssertions = failed misspelt;
  script = c.vmtests.instrumentation.backdoorScript;
  execStart = c.systemd.services.vmtests-backdoor.serviceConfig.ExecStart;
  wantedBy = c.systemd.services.vmtests-backdoor.wantedBy;
  disabled = builtins.filter (n: (c.systemd.services.${n}.enable or true) == false)
    (builtins.attrNames c.systemd.services);
  kernelParams = c.boot.kernelParams;
  consoleLogLevel = c.boot.consoleLogLevel;
  path = c.systemd.services.vmtests-backdoor.path;
  storage = c.services.journald.settings.Journal.Storage;
  sshd = c.services.openssh.enable;
  rootKeys = c.users.users.root.openssh.authorizedKeys.keys;
}
"""


@pytest.fixture(scope="module")
def nixos_side() -> dict[str, object]:
    """The NixOS module evaluated with nixpkgs lib and stub option declarations."""
    nix = shutil.which("nix-instantiate")
    lib = find_nixpkgs_lib()
    if nix is None or lib is None:
        pytest.skip("needs nix-instantiate and a nixpkgs lib (see tests/eval/conftest.py)")
    packages = " ".join(f'"{attr}"' for attr in sorted(set(contract.GUEST_TOOLS.values())))
    expr = (
        EVAL.replace("@LIB@", str(lib))
        .replace("@MODULE@", str(MODULE))
        .replace("@TOOL_PACKAGES@", f"[ {packages} ]")
    )
    result = subprocess.run(
        [nix, "--eval", "--strict", "--json", "--expr", expr],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


@pytest.mark.nix
def test_nixos_module_renders_the_same_backdoor_as_the_reference_guest(
    nixos_side: dict[str, object],
) -> None:
    assert nixos_side["script"] == contract.backdoor_script("/fake/bash/bin/sh")
    assert nixos_side["execStart"] == nixos_side["script"]
    assert nixos_side["wantedBy"] == ["multi-user.target"]


@pytest.mark.nix
def test_nixos_module_implements_console_gettys_sshd_and_journal(
    nixos_side: dict[str, object],
) -> None:
    assert f"console={contract.SERIAL_DEVICE}" in nixos_side["kernelParams"]  # type: ignore[operator]
    assert nixos_side["consoleLogLevel"] == contract.CONSOLE_LOG_LEVEL
    expected = sorted(unit.removesuffix(".service") for unit in contract.MASKED_GETTYS)
    assert sorted(nixos_side["disabled"]) == expected  # type: ignore[call-overload]
    assert nixos_side["storage"] == contract.JOURNAL_STORAGE
    assert nixos_side["sshd"] is True
    assert nixos_side["rootKeys"] == ["ssh-ed25519 AAAAtest"]


@pytest.mark.nix
def test_nixos_backdoor_path_is_the_tool_manifest(nixos_side: dict[str, object]) -> None:
    """Every program of the manifest reaches the backdoor through its nixpkgs attribute."""
    expected = {f"/fake/{attr}" for attr in contract.GUEST_TOOLS.values()}
    assert set(nixos_side["path"]) == expected  # type: ignore[call-overload]
    assert nixos_side["failedAssertions"] == []


@pytest.mark.nix
def test_a_configuration_supplies_a_manifest_package_itself(nixos_side: dict[str, object]) -> None:
    """The stub device layer's tt-smi replaces pkgs.tt-smi; a misspelt attribute is refused."""
    path = set(nixos_side["suppliedPath"])  # type: ignore[call-overload]
    assert "/stub/tt-smi" in path
    assert "/fake/tt-smi" not in path
    messages = nixos_side["misspeltAssertions"]
    assert isinstance(messages, list)
    assert len(messages) == 1, messages
    message = str(messages[0])
    assert message.startswith("vmtests.instrumentation.toolPackages sets tt_smi, which the tool")
    assert "tt-smi" in message


def test_reference_guest_files_follow_the_contract() -> None:
    files = _rendered_files("ssh-ed25519 AAAAtest vmtests")
    assert files["usr/local/libexec/vmtests-backdoor"] == contract.backdoor_script(toolpath.SHELL)
    assert (
        f"Storage={contract.JOURNAL_STORAGE}" in files["etc/systemd/journald.conf.d/vmtests.conf"]
    )
    assert files["root/.ssh/authorized_keys"] == "ssh-ed25519 AAAAtest vmtests\n"
    unit = files[f"etc/systemd/system/{contract.BACKDOOR_UNIT}"]
    assert "ExecStart=/usr/local/libexec/vmtests-backdoor" in unit
    # The backdoor's PATH is the tool manifest's directory and nothing else, as on NixOS.
    assert f"Environment=PATH={toolpath.TOOLS_DIR}\n" in unit
    assert "WantedBy=multi-user.target" in unit


@pytest.mark.vm
def test_running_guest_follows_the_contract(shared_guest: QemuMachine) -> None:
    shared_guest.wait_for_unit("ssh.service", timeout=120)
    assert shared_guest.succeed(f"systemctl is-active {contract.BACKDOOR_UNIT}") == "active\n"
    assert shared_guest.succeed("readlink -f " + contract.BACKDOOR_DEVICE).startswith("/dev/vport")
    storage = shared_guest.succeed("journalctl --header -n0 | head -1; ls -d /var/log/journal/*/")
    assert "/var/log/journal/" in storage  # persistent journal files exist
    for getty in contract.MASKED_GETTYS:
        state = shared_guest.execute(f"systemctl is-enabled {getty}").stdout_text.strip()
        assert state == "masked", f"{getty}: {state}"
    cmdline = shared_guest.succeed("cat /proc/cmdline")
    assert f"console={contract.SERIAL_DEVICE}" in cmdline

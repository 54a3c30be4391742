# Test-only shim for evaluating this repository's NixOS configurations with a TRIMMED nixpkgs tree
# (a slimmed nixpkgs snapshot without some modules and packages; see scripts/setup-nixos-eval).
# It is loaded only for such a tree (vmtests/nixos_eval.py decides), never with a full nixpkgs
# (the flake's own nixpkgs input on a Nix host).
#
# It stubs exactly what the trimmed tree lacks but its remaining modules still reference, found
# by evaluating every configuration, check and app of flake.nix. It never declares an option
# that this repository sets itself (tests/eval/test_eval_nixos.py checks that against the
# configurations' definitions): hardware.tenstorrent comes from the tree's own
# nixos/modules/hardware/tenstorrent.nix, which the trimmed module list merely omits.
# Stubbed packages are derivations that fail if anyone tries to build them.
{ lib, modulesPath, ... }:
let
  # An option a module of the tree sets (mkVMOverride false, …) but whose module was trimmed.
  stubOption = lib.mkOption {
    type = lib.types.anything;
    default = { };
    internal = true;
    description = "Stub for an option whose nixpkgs module the trimmed tree lacks (eval only).";
  };
in
{
  imports = [
    # nixos/modules/hardware/tenstorrent.nix exists in the tree but not in its module-list.nix.
    (modulesPath + "/hardware/tenstorrent.nix")
  ];

  # Options that modules of the tree set (e.g. qemu-vm.nix: services.connman.enable =
  # mkVMOverride false) but whose own modules were trimmed away.
  options = {
    services.connman = stubOption;
    services.qemuGuest = stubOption;
    virtualisation.hypervGuest = stubOption;
  };

  config.nixpkgs.overlays = [ (import ./nixos-shim-packages.nix) ];
}

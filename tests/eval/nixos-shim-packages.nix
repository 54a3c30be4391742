# Package half of tests/eval/nixos-shim.nix (an overlay): packages a trimmed nixpkgs tree lacks
# but its remaining modules and packages still reference (found by evaluating every
# configuration, check and app). An overlay cannot ask `prev ? name` without infinite
# recursion, so the list is explicit, and the shim is loaded only for a trimmed tree. Each stub
# is a derivation that fails when built, so nothing can silently use it; evaluation only needs
# its drvPath, pname and version.
final: prev:
let
  inherit (prev) lib;
  stub =
    name:
    final.runCommandLocal name
      {
        pname = name;
        version = "0-vmtests-eval-stub";
        # Read by tests/eval/nixos-eval.nix (`versions`): a stub has no version to report.
        passthru.vmtestsEvalStub = true;
      }
      ''
        echo "${name} is an evaluation-only stub of tests/eval/nixos-shim-packages.nix; it cannot be built" >&2
        exit 1
      '';
in
lib.genAttrs [
  "mtdutils"
  # nixos/modules/hardware/tenstorrent.nix: environment.systemPackages.
  "tt-smi"
  "tt-system-tools"
  # pkgs/build-support/docker/default.nix (dockerTools, the stub image).
  "fakeNss"
  # pkgs/by-name/qe/qemu/package.nix (the VM's and the vmtests app's QEMU).
  "canokey-qemu"
  "libu2f-emu"
  "spice"
  # pkgs/build-support/vm/default.nix (make-disk-image's VM tools).
  # pkgs/by-name/ni/nixfmt: a Haskell package, and the tree's Haskell package set is empty (the
  # flake's formatter and devShell).
  "nixfmt"
  # nixos/modules/services/x11/xserver.nix: knownVideoDriverPackages (the option's documentation);
  # the tree keeps only xf86-video-amdgpu and xf86-video-dummy.
  "xf86-video-apm"
  "xf86-video-ark"
  "xf86-video-ast"
  "xf86-video-ati"
  "xf86-video-chips"
  "xf86-video-cirrus"
  "xf86-video-fbdev"
  "xf86-video-geode"
  "xf86-video-i128"
  "xf86-video-i740"
  "xf86-video-intel"
  "xf86-video-mga"
  "xf86-video-neomagic"
  "xf86-video-nested"
  "xf86-video-nouveau"
  "xf86-video-nv"
  "xf86-video-omap"
  "xf86-video-openchrome"
  "xf86-video-qxl"
  "xf86-video-r128"
  "xf86-video-s3virge"
  "xf86-video-savage"
  "xf86-video-siliconmotion"
  "xf86-video-sis"
  "xf86-video-sisusb"
  "xf86-video-suncg6"
  "xf86-video-sunffb"
  "xf86-video-sunleo"
  "xf86-video-tdfx"
  "xf86-video-trident"
  "xf86-video-v4l"
  "xf86-video-vbox"
  "xf86-video-vesa"
  "xf86-video-vmware"
  "xf86-video-voodoo"
]
  stub
// {
  # nixos/doc/manual/default.nix copies a font out of pkgs.roboto.src (the NixOS manual).
  roboto = stub "roboto" // {
    src = stub "roboto-src";
  };
  # The trimmed tree has no Haskell package set, hence no ShellCheck. With
  # compiler.bootstrapAvailable = false, writeShellApplication (pkgs/build-support/trivial-builders/
  # default.nix) and others skip their shellcheck step, as on a platform without GHC.
  shellcheck-minimal = stub "shellcheck-minimal" // {
    compiler.bootstrapAvailable = false;
  };
}

# The VM test's starting point: the production host (../cfx-llm2/host.nix) with the serving
# module's defaults, as before serve issue #52 (../profiles/baseline.nix), in the VM of
# ./common.nix. The test switches it to a target (target.nix) and reboots.
# `targets` are the target systems' toplevels and `sources` the flake's source and its nixpkgs
# input: their closures go into this VM's disk image, so that both `nixos-rebuild switch --flake`
# and the pre-built `switch-to-configuration` path need no network and build nothing in the VM.
{
  targets,
  sources ? [ ],
}:
{ ... }:
{
  imports = [
    (import ../cfx-llm2/host.nix { servingProfile = ../profiles/baseline.nix; })
    ./common.nix
  ];

  virtualisation.additionalPaths = targets ++ sources;
}

# The VM test's starting point: serving enabled with the module defaults, as before serve
# issue #52 (../profiles/baseline.nix). The test switches it to a target (target.nix) and
# reboots. `targets` are the target systems' toplevels; their closures go into this VM's disk
# image so the switch needs no network and no build inside the VM.
{ targets }:
{ ... }:
{
  imports = [ ./common.nix ];

  services.tenstorrent-serving = import ../profiles/baseline.nix // {
    enable = true;
  };

  virtualisation.additionalPaths = targets;
}

# cfx-llm2 as a host, without its hardware file and device layer: everything that the VM test
# targets exercise unchanged (hosts/vm-test/target.nix swaps in the VM and the stub device layer
# for ./hardware.nix and ./device.nix). Every validated serving setting is declared here
# (through the serving profile), so `nixos-rebuild switch` and a reboot keep all of them:
# nothing lives under /run or in hand-typed container flags any more (#49, #52).
#
# `servingProfile` is the one line that picks the serving profile. Switch to
# ../profiles/resident.nix (resident decode + on-device argmax) only after the advisory's gates
# pass; see that file for why. The VM tests also run this host with the other profiles.
{
  servingProfile ? ../profiles/cfx-llm2.nix,
}:
{ ... }:
{
  imports = [ ../../modules/tenstorrent-serving.nix ];

  networking.hostName = "cfx-llm2";

  # Production boots systemd-boot on EFI (nixos/modules/system/boot/loader/systemd-boot/
  # systemd-boot.nix); the VM tests boot the same way (virtualisation.useEFIBoot).
  boot.loader.systemd-boot.enable = true;
  boot.loader.efi.canTouchEfiVariables = true;

  services.tenstorrent-serving = import servingProfile // {
    enable = true;
    # The NixOS firewall (on by default) keeps port 8000 closed to other machines: vLLM runs
    # without an API key. Set `openFirewall = true` to serve remote clients directly.
    extraOptions = [ "--volume=/var/lib/models:/models:ro" ];
  };

  system.stateVersion = "25.05";
}

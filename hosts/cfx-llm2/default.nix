# cfx-llm2: the production P150 serving host. Every validated serving setting is declared here
# (through the serving profile), so `nixos-rebuild switch` and a reboot keep all of them:
# nothing lives under /run or in hand-typed container flags any more (#49, #52).
{ ... }:
let
  # The one line that picks the serving profile. Switch to ../profiles/resident.nix (resident
  # decode + on-device argmax) only after the advisory's gates pass; see that file for why.
  servingProfile = ../profiles/cfx-llm2.nix;
in
{
  imports = [
    ../../modules/tenstorrent-serving.nix
    ./hardware.nix
  ];

  networking.hostName = "cfx-llm2";

  # tt-kmd and tt-smi from nixpkgs; the serving container gets /dev/tenstorrent/0.
  hardware.tenstorrent.enable = true;

  services.tenstorrent-serving = import servingProfile // {
    enable = true;
    extraOptions = [ "--volume=/var/lib/models:/models:ro" ];
  };

  system.stateVersion = "25.05";
}

# cfx-llm2's device layer: tt-kmd and tt-smi from nixpkgs (nixos/modules/hardware/tenstorrent.nix);
# the serving container gets /dev/tenstorrent/0. The VM tests replace this file with the stubbed
# device layer (modules/tenstorrent-stub.nix).
{ ... }:
{
  hardware.tenstorrent.enable = true;
}

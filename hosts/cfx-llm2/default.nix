# cfx-llm2: the production P150 serving host. The host itself (serving profile, boot loader,
# volumes) is ./host.nix; the machine-specific parts are ./hardware.nix and ./device.nix, the
# only two files the VM test targets swap (for the VM and the stubbed device layer).
{ ... }:
{
  imports = [
    (import ./host.nix { })
    ./hardware.nix
    ./device.nix
  ];
}

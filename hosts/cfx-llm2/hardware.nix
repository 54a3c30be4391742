# Machine-specific parts of cfx-llm2 that the serving setup does not depend on. Replace with the
# host's `nixos-generate-config` output; the labels below keep the configuration evaluable.
# The boot loader is in ./host.nix (the VM tests boot the same way).
{ ... }:
{
  boot.initrd.availableKernelModules = [
    "nvme"
    "xhci_pci"
    "ahci"
    "usbhid"
    "sd_mod"
  ];

  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };
  fileSystems."/boot" = {
    device = "/dev/disk/by-label/boot";
    fsType = "vfat";
  };

  nixpkgs.hostPlatform = "x86_64-linux";
}

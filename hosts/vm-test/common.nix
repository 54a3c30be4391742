# What every VM test host shares: a persistent, bootloader-booted QEMU VM with the stubbed P150
# device layer and the suite's instrumentation. The serving profiles are imported unchanged;
# only the device layer differs from production (the stub sets the image to the stub server).
#
# Persistence traps (nixpkgs nixos/modules/virtualisation/qemu-vm.nix):
# - direct boot would always boot the generation fixed at build time, so the VM boots through
#   its bootloader from a persistent qcow2 disk (virtualisation.useBootLoader);
# - with a bootloader the host store is not mounted; the disk image holds the closure of the
#   base system and of virtualisation.additionalPaths (the targets, see base.nix), so a switch
#   and a reboot work offline.
{ modulesPath, ... }:
{
  imports = [
    (modulesPath + "/virtualisation/qemu-vm.nix")
    ../../modules/tenstorrent-serving.nix
    ../../modules/tenstorrent-stub.nix
    ../../modules/test-instrumentation.nix
  ];

  networking.hostName = "vm-test";

  virtualisation = {
    useBootLoader = true;
    # Relative to the directory the run script starts in; override with $NIX_DISK_IMAGE.
    diskImage = "./vm-test.qcow2";
    diskSize = 8192;
    # 2 x 1 GiB hugepages (the cfx-llm2 profile) plus the system and docker.
    memorySize = 4096;
    cores = 2;
    graphics = false;
  };

  hardware.tenstorrent-stub.enable = true;
  vmtests.instrumentation.enable = true;

  system.stateVersion = "25.05";
}

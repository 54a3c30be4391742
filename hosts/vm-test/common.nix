# The VM that replaces cfx-llm2's hardware file (../cfx-llm2/hardware.nix) and device layer
# (../cfx-llm2/device.nix) in every VM test host: a persistent QEMU VM booted like production
# (systemd-boot on EFI), the stubbed P150 device layer and the suite's instrumentation. The host
# itself (../cfx-llm2/host.nix: serving profile, volumes, boot loader) is imported unchanged by
# base.nix and target.nix.
#
# Persistence traps (nixpkgs nixos/modules/virtualisation/qemu-vm.nix):
# - direct boot would always boot the generation fixed at build time, so the VM boots through
#   its bootloader from a persistent qcow2 disk (virtualisation.useBootLoader, useEFIBoot);
# - with a bootloader the host store is not mounted; the disk image holds the closure of the
#   base system and of virtualisation.additionalPaths (the targets and the flake sources, see
#   base.nix), so a switch and a reboot work offline;
# - the system image is built with `additionalSpace = "0M"`: diskSize grows only the virtual
#   disk, so the root partition and its ext4 are grown at boot (boot.growPartition:
#   nixos/modules/system/boot/grow-partition.nix; autoResize: nixos/modules/tasks/filesystems.nix).
{
  config,
  lib,
  pkgs,
  modulesPath,
  ...
}:
let
  # Memory, vCPUs, kernel parameters and console level of every test guest, NixOS VM and
  # reference guest alike (docs/instrumentation.md).
  contract = builtins.fromJSON (builtins.readFile ../../vmtests/contracts/instrumentation.json);
  serving = config.services.tenstorrent-serving;
  hugepageMB =
    if serving.enable then
      serving.hugepages.count
      * {
        "1G" = 1024;
        "2M" = 2;
      }
      .${serving.hugepages.size}
    else
      0;
  # The rule of vmtests/guest/resources.py, with the contract's numbers (the measurements behind
  # them are in docs/ci-time.md): the pages, the headroom the system, docker and the server
  # need, and for 1 GiB pages the RAM below 4 GiB, which never yields an aligned GiB on QEMU's
  # pc machine.
  requiredMB =
    contract.resources.hugepageHeadroomMB
    + hugepageMB
    + (
      if hugepageMB > 0 && serving.hugepages.size == "1G" then
        contract.resources.hugepageLowMemoryMB
      else
        0
    );
  # nixpkgs' own test key pair (nixos/tests/ssh-keys.nix, the RFC 9500 test key): the suite's
  # key for NixOS test VMs; its private half is `snakeOilPrivateKey` of the same file.
  sshKeys = import (modulesPath + "/../tests/ssh-keys.nix") pkgs;
in
{
  imports = [
    (modulesPath + "/virtualisation/qemu-vm.nix")
    ../../modules/tenstorrent-stub.nix
    ../../modules/test-instrumentation.nix
  ];

  virtualisation = {
    useBootLoader = true;
    useEFIBoot = true;
    # Relative to the directory the run script starts in; override with $NIX_DISK_IMAGE.
    diskImage = "./vm-test.qcow2";
    diskSize = 8192;
    memorySize = contract.resources.memoryMB;
    cores = contract.resources.cpus;
    graphics = false;
    fileSystems."/".autoResize = true;
  };
  boot.growPartition = true;

  # The driver asks the serving port from the host through QEMU's forwarded port, which reaches
  # the guest from outside: the NixOS firewall, on by default, would drop it (nixpkgs
  # nixos/modules/virtualisation/qemu-vm.nix: forwarded ports must be opened in the guest's
  # firewall; nixos/modules/services/networking/firewall.nix). Opened here, in the VM layer,
  # so that the serving settings stay exactly production's.
  networking.firewall.allowedTCPPorts = [ config.services.tenstorrent-serving.port ];

  assertions = [
    {
      assertion = requiredMB <= config.virtualisation.memorySize;
      message = "services.tenstorrent-serving.hugepages reserve ${toString hugepageMB} MB, which need ${toString requiredMB} MB of VM memory to be reserved reliably, but the VM has ${toString config.virtualisation.memorySize} MB: raise resources.memoryMB in vmtests/contracts/instrumentation.json or lower hugepages.count.";
    }
  ];

  # Offline, like nixpkgs' own nixos-rebuild tests (nixos/tests/nixos-rebuild-specialisations.nix):
  # no binary cache; everything the switch needs is already in the disk image.
  nix.settings = {
    substituters = lib.mkForce [ ];
    hashed-mirrors = null;
    connect-timeout = 1;
    experimental-features = [
      "nix-command"
      "flakes"
    ];
  };

  # The same system name inside the VM as on the host. The flake's nixpkgs input gives
  # `system.nixos.versionSuffix`/`revision` their defaults from its rev and date
  # (nixpkgs lib/flake-version-info.nix, nixos/modules/misc/version.nix); inside the VM the input
  # is overridden with a `path:` of its store path, which has neither, so the target would
  # evaluate to another toplevel than the one in the image and nixos-rebuild would try to build
  # it offline. Fixed values make both evaluations the same derivation.
  system.nixos.versionSuffix = ".vmtests";
  system.nixos.revision = null;

  hardware.tenstorrent-stub.enable = true;
  vmtests.instrumentation = {
    enable = true;
    authorizedKeys = [ sshKeys.snakeOilPublicKey ];
  };
}

# NixOS side of the vmtests instrumentation contract (docs/instrumentation.md).
#
# The contract's data and the backdoor script template live in ../vmtests/contracts/instrumentation.json,
# which the Python side (vmtests/contracts/instrumentation.py: the reference guest and the QEMU backend)
# reads too, so both guests follow one definition:
#   - kernel console on ttyS0 (captured per boot by the host);
#   - a root backdoor shell on the named virtio serial port (not hvc0: QEMU drops virtconsole
#     output when the host is momentarily slow; serial ports are flow-controlled), printing a
#     ready line with the boot ID;
#   - sshd accepting the suite's key for root;
#   - persistent journald.
# It replaces nixpkgs' testing/test-instrumentation.nix for our VMs (same idea, different
# channel); the QEMU side (-device virtserialport,name=..., sockets) comes from the driver,
# which passes it to the run-<name>-vm script (vmtests/driver/qemu_launch.py).
{
  config,
  lib,
  pkgs,
  options,
  ...
}:
let
  cfg = config.vmtests.instrumentation;
  contract = builtins.fromJSON (builtins.readFile ../vmtests/contracts/instrumentation.json);
  backdoorDevice = "/dev/virtio-ports/${contract.backdoorPortName}";

  # Same substitution as vmtests.contracts.instrumentation.backdoor_script(shell).
  backdoorScript =
    shell:
    builtins.replaceStrings
      [ "@backdoorDevice@" "@serialDevice@" "@readyPrefix@" "@shell@" ]
      [ backdoorDevice contract.serialDevice contract.backdoorReadyPrefix shell ]
      (lib.concatStringsSep "\n" contract.backdoorScript + "\n");

  # journald's option moved from extraConfig to settings in newer nixpkgs; support both.
  journaldStorage =
    if options.services.journald ? settings then
      { settings.Journal.Storage = contract.journalStorage; }
    else
      { extraConfig = "Storage=${contract.journalStorage}"; };

  # The backdoor's PATH: every program of the contract's tool manifest, from the nixpkgs
  # attribute the manifest names. A service's PATH is only its `path` plus coreutils, findutils,
  # gnugrep, gnused and systemd (nixpkgs nixos/lib/systemd-lib.nix); nixpkgs' own backdoor
  # sources /etc/profile instead (nixos/modules/testing/test-instrumentation.nix). Here the
  # manifest is the whole PATH contract, and the reference guest gets exactly the same programs.
  # A configuration may supply a manifest attribute itself (the stub device layer's tt-smi).
  manifestAttributes = lib.unique (lib.attrValues contract.tools);
  resolvedToolPackages = lib.genAttrs manifestAttributes (
    attr:
    cfg.toolPackages.${attr} or pkgs.${attr} or (throw (
      "the tool manifest (vmtests/contracts/instrumentation.json) names pkgs.${attr}, which this "
      + "nixpkgs lacks; set vmtests.instrumentation.toolPackages.${attr} to the package that "
      + "provides it"
    ))
  );
  unknownToolPackages = lib.subtractLists manifestAttributes (lib.attrNames cfg.toolPackages);

  maskedGettys = lib.genAttrs (map (lib.removeSuffix ".service") contract.maskedGettys) (_: {
    enable = false;
  });
in
{
  options.vmtests.instrumentation = {
    enable = lib.mkEnableOption ''
      the vmtests instrumentation contract: root backdoor shell on the virtio port
      ${contract.backdoorPortName}, kernel console on ${contract.serialDevice}, sshd for root with
      the suite's key and a persistent journal. Test VMs only: the backdoor is an unauthenticated
      root shell for whoever controls the VM's QEMU process'';

    authorizedKeys = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      default = [ ];
      example = [ "ssh-ed25519 AAAA... vmtests" ];
      description = "Public keys that may log in as ${contract.sshUser} over ssh (the suite's key).";
    };

    toolPackages = lib.mkOption {
      type = lib.types.attrsOf lib.types.package;
      default = { };
      example = lib.literalExpression ''{ tt-smi = pkgs.writeShellScriptBin "tt-smi" "..."; }'';
      description = ''
        Packages for nixpkgs attributes of the contract's tool manifest that this configuration
        provides itself rather than nixpkgs (the device layer's `tt-smi`). Every other program
        of the manifest comes from `pkgs.<attribute>`.
      '';
    };

    resolvedToolPackages = lib.mkOption {
      type = lib.types.attrsOf lib.types.package;
      readOnly = true;
      default = resolvedToolPackages;
      defaultText = lib.literalMD "each manifest attribute from `toolPackages`, else `pkgs`";
      description = "The package of each nixpkgs attribute of the tool manifest: the backdoor's `path` (read-only).";
    };

    shell = lib.mkOption {
      type = lib.types.str;
      default = "${pkgs.bash}/bin/sh";
      defaultText = lib.literalExpression ''"''${pkgs.bash}/bin/sh"'';
      description = "The shell that reads the backdoor's commands.";
    };

    backdoorScript = lib.mkOption {
      type = lib.types.str;
      readOnly = true;
      default = backdoorScript cfg.shell;
      description = "The rendered backdoor program (read-only; compared with the Python side).";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = unknownToolPackages == [ ];
        message = "vmtests.instrumentation.toolPackages sets ${lib.concatStringsSep ", " unknownToolPackages}, which the tool manifest (vmtests/contracts/instrumentation.json, \"tools\") does not name: use one of its nixpkgs attributes (${lib.concatStringsSep ", " manifestAttributes}).";
      }
    ];

    # The contract's kernel parameters and console level. NixOS defaults to consoleLogLevel 4
    # (nixos/modules/system/boot/kernel.nix, which also adds `loglevel=<level>`): the
    # `Linux version` notice (level 5) would never reach the serial console.
    boot.kernelParams = contract.kernelParams;
    boot.consoleLogLevel = contract.consoleLogLevel;
    boot.kernelModules = [ "virtio_console" ];

    systemd.services = maskedGettys // {
      vmtests-backdoor = {
        description = "vmtests backdoor root shell on ${backdoorDevice}";
        wantedBy = [ "multi-user.target" ];
        requires = [ "dev-${contract.serialDevice}.device" ];
        after = [
          "dev-${contract.serialDevice}.device"
          "systemd-udevd.service"
        ];
        # The packages in the order of their first program by name (fromJSON gives the
        # manifest as an attrset, and attrValues sorts it); attrVals keeps that order.
        path = lib.attrVals manifestAttributes cfg.resolvedToolPackages;
        # The backdoor's shell runs the switch itself: switch-to-configuration must never
        # restart it mid-command (nixpkgs nixos/lib/systemd-unit-options.nix, restartIfChanged;
        # rendered as X-RestartIfChanged=false by nixos/lib/systemd-lib.nix).
        restartIfChanged = false;
        serviceConfig = {
          ExecStart = pkgs.writeScript "vmtests-backdoor" cfg.backdoorScript;
          # The shell ends with its session, like nixpkgs' backdoor.
          KillSignal = "SIGHUP";
        };
      };
    };

    # `vmtests shell --sh` reaches the VM's sshd on the forwarded port 22 and logs in with a key
    # it appends to root's ~/.ssh/authorized_keys over the backdoor: both are nixpkgs' defaults
    # (nixos/modules/services/networking/ssh/sshd.nix, openFirewall, authorizedKeysInHomedir),
    # said here so that a host configuration setting either to a plain `false` fails the
    # evaluation, not the shell (a `lib.mkForce false`, another `authorizedKeysFiles` or a port
    # other than 22 would still pass it: the eval tier's rendered units are where to look).
    services.openssh = {
      enable = true;
      openFirewall = true;
      authorizedKeysInHomedir = true;
      settings.PermitRootLogin = "prohibit-password";
    };
    users.users.${contract.sshUser}.openssh.authorizedKeys.keys = cfg.authorizedKeys;

    services.journald = journaldStorage;
  };
}

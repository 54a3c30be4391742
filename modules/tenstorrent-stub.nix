# Stubbed Tenstorrent P150 device layer for NixOS VMs (no card, no network).
#
# With hardware.tenstorrent-stub.enable the VM gets what the serving module needs from a P150
# host, so services.tenstorrent-serving runs unchanged:
# - /dev/tenstorrent/0, a character device (major 120, from a char range the kernel's
#   Documentation/admin-guide/devices.txt lists for local/experimental use, 120-127; no driver
#   backs it: only stat and docker's --device use it), created at every boot;
# - the stub driver version file /run/tenstorrent-stub/driver-version (stands in for
#   /sys/module/tenstorrent/version; volatile like sysfs, rewritten at every boot);
# - the stub tt-smi on PATH;
# - a dockerTools image of the stub vLLM server (python3 -m vmtests.stub.server), loaded offline
#   through services.tenstorrent-serving.imageFile.
#
# The tmpfiles rules are the same as vmtests/stub/device.py's (tests/stub/test_stub_install.py
# fails if they drift); the stub's environment knobs are documented in vmtests/stub/knobs.py.
{
  config,
  lib,
  pkgs,
  options,
  ...
}:
let
  cfg = config.hardware.tenstorrent-stub;

  # Only the stub subpackage and the contracts it reads: the server and tt-smi use the standard
  # library alone. The features.json link is left out and replaced by the file it points to.
  packageSource =
    dir:
    builtins.path {
      name = "vmtests-${baseNameOf dir}-source";
      path = dir;
      filter =
        path: type:
        let
          base = baseNameOf path;
        in
        base != "__pycache__" && base != "features.json" && !(lib.hasSuffix ".pyc" base);
    };

  stubPackage = pkgs.runCommand "vmtests-stub-package" { } ''
    root=$out/lib/vmtests-stub/vmtests
    mkdir -p $root
    cp ${../vmtests/__init__.py} $root/__init__.py
    cp -r ${packageSource ../vmtests/stub} $root/stub
    cp -r ${packageSource ../vmtests/contracts} $root/contracts
    chmod -R u+w $root
    cp ${./serving/features.json} $root/contracts/features.json
  '';

  pythonPath = "${stubPackage}/lib/vmtests-stub";

  ttSmi = pkgs.writeShellScriptBin "tt-smi" ''
    PYTHONPATH=${pythonPath} exec ${cfg.python}/bin/python3 -m vmtests.stub.tt_smi "$@"
  '';

  stubImage = pkgs.dockerTools.buildLayeredImage {
    name = "vmtests-stub-vllm";
    tag = "latest";
    contents = [ cfg.python ];
    config = {
      Entrypoint = [
        "${cfg.python}/bin/python3"
        "-m"
        "vmtests.stub.server"
      ];
      Env = [
        "PYTHONPATH=${pythonPath}"
        "PYTHONUNBUFFERED=1"
      ];
    };
  };
in
{
  options.hardware.tenstorrent-stub = {
    enable = lib.mkEnableOption "the stubbed Tenstorrent P150 device layer (VM tests only)";
    python = lib.mkOption {
      type = lib.types.package;
      default = pkgs.python3;
      defaultText = lib.literalExpression "pkgs.python3";
      description = "Python that runs the stub tt-smi and the stub server image (standard library only).";
    };
    image = lib.mkOption {
      type = lib.types.package;
      readOnly = true;
      default = stubImage;
      defaultText = lib.literalMD "a `dockerTools.buildLayeredImage` of the stub vLLM server";
      description = "The stub serving image archive (`vmtests-stub-vllm:latest`).";
    };
  };

  config = lib.mkIf cfg.enable (
    {
      assertions = [
        {
          assertion = !(config.hardware.tenstorrent.enable or false);
          message = "hardware.tenstorrent-stub and hardware.tenstorrent (the real tt-kmd) exclude each other: a VM host sets hardware.tenstorrent-stub.enable and must not import the production host's device layer (hosts/cfx-llm2/device.nix); a real host sets hardware.tenstorrent-stub.enable = false.";
        }
      ];

      systemd.tmpfiles.rules = [
        "d /dev/tenstorrent 0755 root root -"
        "c /dev/tenstorrent/0 0666 root root - 120:0"
        "d /run/tenstorrent-stub 0755 root root -"
        "f+ /run/tenstorrent-stub/driver-version 0444 root root - 2.10.0"
        # The stub's fault knobs reach the server in the container through this file, as
        # `docker run --env-file` (oci-containers `environmentFiles`, nixpkgs
        # nixos/modules/virtualisation/oci-containers.nix); the reference guest uses the same
        # path and rules (vmtests/stub/device.py). Created empty (every fault off) when missing
        # and never overwritten, so a test can write it and its knobs survive a reboot; an
        # environment.etc file would be rewritten at every boot and switch (setup-etc.pl).
        "d /etc/vmtests-stub 0755 root root -"
        "f /etc/vmtests-stub/knobs.env 0644 root root -"
      ];

      environment.systemPackages = [ ttSmi ];
    }
    # The serving module runs unchanged; only where its image comes from differs. Guarded, so
    # that the stub module also evaluates without the serving module imported.
    // lib.optionalAttrs (options ? services.tenstorrent-serving) {
      services.tenstorrent-serving = {
        image = lib.mkDefault "${stubImage.imageName}:${stubImage.imageTag}";
        imageFile = lib.mkDefault stubImage;
      };

      virtualisation.oci-containers.containers = lib.mkIf config.services.tenstorrent-serving.enable {
        tenstorrent-serving.environmentFiles = [ "/etc/vmtests-stub/knobs.env" ];
      };
    }
    # The backdoor's PATH is the contract's tool manifest only (modules/test-instrumentation.nix);
    # its `tt-smi` is this stub, as /run/current-system/sw/bin has it for a login shell.
    // lib.optionalAttrs (options ? vmtests.instrumentation.toolPackages) {
      vmtests.instrumentation.toolPackages.tt-smi = ttSmi;
    }
  );
}

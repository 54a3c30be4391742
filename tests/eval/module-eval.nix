# Full evaluation of modules/tenstorrent-serving.nix with a real nixpkgs `lib` and
# lib.evalModules, without nixpkgs' NixOS modules (there is no nixpkgs here). It declares, by
# hand, only the NixOS options the module touches, and a small model of what nixpkgs'
# oci-containers module defines for a container's unit (serviceName default, the bare
# `docker stop`, `docker rm -f` and TimeoutStopSec = 120), so that the module's overrides are
# tested against the definitions they have to win over.
#
#   nix-instantiate --eval --strict --json tests/eval/module-eval.nix \
#     --arg lib 'import ~/.cache/vmtests/nixpkgs-lib' --arg values 'import ./hosts/profiles/cfx-llm2.nix'
#
# With `host = ./hosts/cfx-llm2;` instead of `values`, the host configuration itself is evaluated
# (options the stubs do not declare are accepted as free-form values).
{
  lib,
  values ? { },
  host ? null,
  backend ? "docker",
}:
let
  inherit (lib) mkOption types;
  str = types.str;
  lines = types.lines;
  strList = types.listOf types.str;
  anything = types.attrsOf types.unspecified;

  unitOptions = {
    description = mkOption {
      type = str;
      default = "";
    };
    wantedBy = mkOption {
      type = strList;
      default = [ ];
    };
    before = mkOption {
      type = strList;
      default = [ ];
    };
    after = mkOption {
      type = strList;
      default = [ ];
    };
    requires = mkOption {
      type = strList;
      default = [ ];
    };
    wants = mkOption {
      type = strList;
      default = [ ];
    };
    conflicts = mkOption {
      type = strList;
      default = [ ];
    };
    unitConfig = mkOption {
      type = anything;
      default = { };
    };
  };

  nixosStubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = mkOption {
        type = strList;
        default = [ ];
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      virtualisation.oci-containers = {
        backend = mkOption {
          type = types.enum [
            "podman"
            "docker"
          ];
          default = "podman"; # nixpkgs' default for stateVersion >= 22.05
        };
        containers = mkOption {
          default = { };
          type = types.attrsOf (
            types.submodule (
              { name, ... }:
              {
                options = {
                  image = mkOption { type = str; };
                  imageFile = mkOption {
                    type = types.nullOr types.package;
                    default = null;
                  };
                  serviceName = mkOption {
                    type = str;
                    default = "${backend}-${name}";
                  };
                  cmd = mkOption {
                    type = strList;
                    default = [ ];
                  };
                  environment = mkOption {
                    type = types.attrsOf str;
                    default = { };
                  };
                  extraOptions = mkOption {
                    type = strList;
                    default = [ ];
                  };
                  log-driver = mkOption {
                    type = str;
                    default = "journald";
                  };
                  autoStart = mkOption {
                    type = types.bool;
                    default = true;
                  };
                };
              }
            )
          );
        };
      };
      systemd.services = mkOption {
        default = { };
        type = types.attrsOf (
          types.submodule {
            options = unitOptions // {
              preStart = mkOption {
                type = lines;
                default = "";
              };
              preStop = mkOption {
                type = lines;
                default = "";
              };
              postStop = mkOption {
                type = lines;
                default = "";
              };
              script = mkOption {
                type = lines;
                default = "";
              };
              serviceConfig = mkOption {
                type = anything;
                default = { };
              };
              enableStrictShellChecks = mkOption {
                type = types.bool;
                default = false;
              };
            };
          }
        );
      };
      systemd.mounts = mkOption {
        default = [ ];
        type = types.listOf (
          types.submodule {
            options = unitOptions // {
              what = mkOption { type = str; };
              where = mkOption { type = str; };
              type = mkOption {
                type = str;
                default = "";
              };
              options = mkOption {
                type = str;
                default = "";
              };
            };
          }
        );
      };
    };
  };

  # What nixpkgs' oci-containers defines for each container's unit (behaviour, not its code).
  ociContainersModel =
    { config, ... }:
    let
      cfg = config.virtualisation.oci-containers;
    in
    {
      config.systemd.services = lib.mapAttrs' (
        name: container:
        lib.nameValuePair container.serviceName {
          wantedBy = lib.optional container.autoStart "multi-user.target";
          after = lib.optionals (cfg.backend == "docker") [
            "docker.service"
            "docker.socket"
          ];
          script = "exec ${cfg.backend} run --name=${name} ...";
          preStop = "${cfg.backend} stop ${name} || true";
          postStop = "${cfg.backend} rm -f ${name} || true";
          serviceConfig = {
            ExecStartPre = [ "/nix/store/00000000000000000000000000000000-pre-start/bin/pre-start" ];
            TimeoutStartSec = 0;
            TimeoutStopSec = 120;
            Restart = "always";
          };
        }
      ) cfg.containers;
    };

  # nixos/lib/systemd-lib.nix makeJobScript, by its result's shape: the script's store path.
  utilsModel = {
    config._module.args.utils.systemdUtils.lib.makeJobScript =
      { name, text, ... }:
      "/nix/store/${builtins.hashString "sha256" text}-unit-script-${name}/bin/${name}";
  };

  evaluated = lib.evalModules {
    modules = [
      utilsModel
      nixosStubs
      ociContainersModel
    ]
    ++ (
      if host == null then
        [
          ../../modules/tenstorrent-serving.nix
          {
            services.tenstorrent-serving = values // {
              enable = true;
            };
          }
        ]
      else
        [
          host
          { _module.freeformType = types.lazyAttrsOf types.raw; }
        ]
    )
    ++ [
      (lib.optionalAttrs (backend == "podman") {
        virtualisation.oci-containers.backend = lib.mkForce "podman";
      })
    ];
  };
  config = evaluated.config;
  container = config.virtualisation.oci-containers.containers.tenstorrent-serving;
  unitOf = unit: {
    inherit (unit)
      description
      wantedBy
      before
      after
      requires
      conflicts
      unitConfig
      ;
  };
in
{
  backend = config.virtualisation.oci-containers.backend;
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  inherit (config) warnings;
  container = {
    inherit (container)
      image
      serviceName
      cmd
      environment
      extraOptions
      log-driver
      ;
    hasImageFile = container.imageFile != null;
  };
  services = builtins.attrNames config.systemd.services;
  firewallPorts = config.networking.firewall.allowedTCPPorts;
  serving =
    let
      unit = config.systemd.services.tenstorrent-serving;
    in
    unitOf unit
    // {
      inherit (unit)
        preStart
        preStop
        postStop
        serviceConfig
        ;
    };
  hugepages =
    let
      unit = config.systemd.services.tenstorrent-hugepages or null;
    in
    if unit == null then null else unitOf unit // { inherit (unit) script serviceConfig; };
  mounts = map (mount: unitOf mount // { inherit (mount) what where type options; }) config.systemd.mounts;
  optionNames = builtins.attrNames evaluated.options.services.tenstorrent-serving;
}

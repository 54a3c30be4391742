# Evaluates modules/tenstorrent-stub.nix with a real nixpkgs `lib` and lib.evalModules, without
# nixpkgs (there is none here): the NixOS options it touches are declared by hand and `pkgs` is a
# small fake whose builders return derivation-shaped attrsets recording their arguments.
#
#   nix-instantiate --eval --strict --json tests/stub/stub-module-eval.nix \
#     --arg lib 'import ~/.cache/vmtests/nixpkgs-lib' --arg enable true
{
  lib,
  enable ? true,
  realDriver ? false,
  # false: the serving module is not imported (its options do not exist), as when a host imports
  # nixosModules.tenstorrent-stub alone.
  servingModule ? true,
}:
let
  inherit (lib) mkOption types;
  fakeDrv = name: extra: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  } // extra;
  pkgs = {
    python3 = fakeDrv "python3" { };
    runCommand = name: _env: script: fakeDrv name { inherit script; };
    writeShellScriptBin = name: text: fakeDrv name { inherit text; };
    dockerTools.buildLayeredImage =
      args:
      fakeDrv "${args.name}.tar.gz" {
        imageName = args.name;
        imageTag = args.tag;
        inherit (args) config contents;
      };
  };
  stubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      systemd.tmpfiles.rules = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      environment.systemPackages = mkOption {
        type = types.listOf types.package;
        default = [ ];
      };
      hardware.tenstorrent.enable = mkOption {
        type = types.bool;
        default = false;
      };
      environment.etc = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      virtualisation.oci-containers.containers = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
    }
    // lib.optionalAttrs servingModule {
      services.tenstorrent-serving = {
        enable = mkOption {
          type = types.bool;
          default = true;
        };
        image = mkOption {
          type = types.str;
          default = "ghcr.io/example/vllm-tt:latest";
        };
        imageFile = mkOption {
          type = types.nullOr types.package;
          default = null;
        };
      };
    };
  };
  evaluated = lib.evalModules {
    specialArgs = { inherit pkgs; };
    modules = [
      stubs
      ../../modules/tenstorrent-stub.nix
      {
        hardware.tenstorrent-stub.enable = enable;
        hardware.tenstorrent.enable = realDriver;
      }
    ];
  };
  config = evaluated.config;
  serving = config.services.tenstorrent-serving or null;
in
{
  image = if serving == null then null else serving.image;
  imageFile = if serving == null || serving.imageFile == null then null else serving.imageFile.name;
  entrypoint = config.hardware.tenstorrent-stub.image.config.Entrypoint;
  imageEnv = config.hardware.tenstorrent-stub.image.config.Env;
  tmpfiles = config.systemd.tmpfiles.rules;
  packages = map (p: p.name) config.environment.systemPackages;
  ttSmi = map (p: p.text) config.environment.systemPackages;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
  knobsFile = config.environment.etc."vmtests-stub/knobs.env" or null;
  containerEnvFiles =
    config.virtualisation.oci-containers.containers.tenstorrent-serving.environmentFiles or [ ];
}

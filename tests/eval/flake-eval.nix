# Evaluates the lazy, nixpkgs-free parts of flake.nix with a nixpkgs `lib` and a fake package
# set: output names, module paths and the core-profiles check. The NixOS configurations
# themselves need real nixpkgs (`nix flake check` on a Nix host).
{ lib }:
let
  flake = import ../../flake.nix;
  fakePkgs = {
    writeText = name: text: { inherit name text; };
  };
  nixpkgs = {
    inherit lib;
    legacyPackages.x86_64-linux = fakePkgs;
  };
  self = flake.outputs { inherit self nixpkgs; };
  system = "x86_64-linux";
in
{
  outputs = builtins.attrNames self;
  nixosModules = builtins.mapAttrs (_: path: toString path) self.nixosModules;
  nixosConfigurations = builtins.attrNames self.nixosConfigurations;
  checks = builtins.attrNames self.checks.${system};
  apps = builtins.attrNames self.apps.${system};
  devShells = builtins.attrNames self.devShells.${system};
  coreProfiles = builtins.fromJSON self.checks.${system}.core-profiles.text;
}

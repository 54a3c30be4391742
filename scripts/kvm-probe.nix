# A throwaway build that succeeds only where a sandboxed build can open /dev/kvm read-write, as
# the persistence checks' QEMU must: scripts/nix-kvm-preflight builds it before
# `nix flake check`. It asks for the `kvm` system feature, as the persistence reports do
# (flake.nix), so it goes where they go; there Nix binds /dev/kvm into the sandbox beside
# /dev/null when its system-features include kvm (the sandbox's /dev set-up: Nix
# src/libstore/build/local-derivation-goal.cc before 2.30, the Linux derivation builder since),
# and the builder runs as the build user without supplementary groups: the test below sees what
# the persistence run's QEMU will see. `stamp` makes each run a new derivation, so a success is
# never reused from the store or from a cache.
{
  stamp,
  pkgs ?
    (builtins.getFlake (toString ../.)).inputs.nixpkgs.legacyPackages.${builtins.currentSystem},
}:
pkgs.runCommand "vmtests-kvm-probe-${stamp}" { requiredSystemFeatures = [ "kvm" ]; } ''
  echo "vmtests-kvm-probe: uid $(id -u), gid $(id -g), groups $(id -G); /dev/kvm: $(stat -c 'mode %a, owner %u:%g' /dev/kvm 2>&1)"
  if ! test -r /dev/kvm -a -w /dev/kvm; then
    echo "vmtests-kvm-probe: this build cannot open /dev/kvm read-write" >&2
    exit 1
  fi
  touch $out
''

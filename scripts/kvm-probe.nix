# A throwaway build that tells whether a sandboxed build can open /dev/kvm read-write, as the
# persistence checks' QEMU must: scripts/nix-kvm-preflight builds it before `nix flake check`.
# It requires the system features of the persistence reports (flake.nix, persistenceReport),
# read from the flake, so it goes where they go. There Nix binds /dev/kvm into the sandbox when
# its system-features include kvm, and the builder calls setgroups(0, 0): a sandboxed build has
# no supplementary groups (NixOS/nix, the sandbox set-up: src/libstore/build/
# local-derivation-goal.cc up to 2.21, src/libstore/unix/build/local-derivation-goal.cc in
# 2.22-2.28, src/libstore/unix/build/derivation-builder.cc in 2.29,
# src/libstore/unix/build/linux-derivation-builder.cc in 2.30-2.34,
# src/libstore/linux/build/linux-derivation-builder.cc since 2.35). So the open below meets what
# the persistence run's QEMU will meet.
#
# Once it runs, the build succeeds and writes its verdict, "open" or "closed", and the mode of
# /dev/kvm in the sandbox ("absent" when there is none): a failed build means that the probe
# could not run, never that /dev/kvm is closed. `stamp` makes each run a new derivation, so a
# verdict is never reused from the store or from a cache.
{
  stamp,
  # git+file: only the tracked files; a bare path would be a path: flake, the whole directory
  # with .git and untracked files (NixOS/nix src/libflake/flakeref.cc,
  # parsePathFlakeRefWithFragment; NixOS/nix#16422).
  flake ? builtins.getFlake "git+file://${toString ../.}",
}:
let
  # The flake's checks exist for this system only (flake.nix).
  system = "x86_64-linux";
  pkgs = flake.inputs.nixpkgs.legacyPackages.${system};
  inherit (pkgs) lib;
  # Only the persistence-* checks (flake.nix), and of their reports only requiredSystemFeatures:
  # the other checks would evaluate whole NixOS systems, the reports' build commands the VMs.
  reports = lib.mapAttrsToList (_: check: check.report) (
    lib.filterAttrs (name: _: lib.hasPrefix "persistence-" name) flake.checks.${system}
  );
  features = lib.unique (lib.concatMap (report: report.requiredSystemFeatures) reports);
in
assert lib.assertMsg (features != [ ]) "scripts/kvm-probe.nix: no persistence-* check in the flake to take the system features from";
pkgs.runCommand "vmtests-kvm-probe-${stamp}" { requiredSystemFeatures = features; }
  ''
    # -c first: <> opens with O_CREAT and would make a file where there is no device.
    if [ -c /dev/kvm ] && { exec 3<>/dev/kvm; } 2>/dev/null; then verdict=open; else verdict=closed; fi
    echo "vmtests-kvm-probe: /dev/kvm is $verdict to this build (uid $(id -u), groups $(id -G); /dev/kvm: $(stat -c 'mode %a, owner %u:%g' /dev/kvm 2>&1))"
    echo "$verdict $(stat -c %a /dev/kvm 2>/dev/null || echo absent)" > $out
  ''

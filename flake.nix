{
  description = "vmtests: prove Tenstorrent LLM serving settings survive nixos-rebuild switch and reboot";

  # The release branch of the nixpkgs that the NixOS eval tier evaluates: NixOS names a
  # release's branch `nixos-<release>` (nixpkgs nixos/doc/manual/installation/upgrading.chapter.md,
  # nixos/modules/installer/tools/tools.nix), and tests/eval/test_eval_nixos.py fails when this
  # branch and the evaluated tree's `.version` disagree. Pin it with `nix flake lock` and commit
  # flake.lock (README: "On a Nix host").
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.11";

  outputs =
    { self, nixpkgs }:
    let
      system = "x86_64-linux";
      inherit (nixpkgs) lib;
      pkgs = nixpkgs.legacyPackages.${system};
      nixos = modules: lib.nixosSystem { inherit system modules; };

      # Serving profiles the VM test can switch to (hosts/profiles/<name>.nix, with the
      # expectations in vmtests/profiles/<name>.yaml).
      servingProfiles = {
        cfx-llm2 = ./hosts/profiles/cfx-llm2.nix;
        resident = ./hosts/profiles/resident.nix;
      };
      vmTargets = lib.mapAttrs (_: profile: nixos [ (import ./hosts/vm-test/target.nix profile) ]) servingProfiles;
      toplevel = configuration: configuration.config.system.build.toplevel;
      # The base VM's disk image holds the targets' toplevels and the sources that
      # `nixos-rebuild switch --flake` evaluates offline: this flake and its nixpkgs input.
      vmBase = nixos [
        (import ./hosts/vm-test/base.nix {
          targets = lib.mapAttrsToList (_: toplevel) vmTargets;
          sources = [
            self.outPath
            nixpkgs.outPath
          ];
        })
      ];

      # `dependencies` must name every [project].dependencies entry of pyproject.toml: nixpkgs'
      # pythonRuntimeDepsCheckHook fails the build on any the wheel's metadata requires that is
      # not installed (pkgs/development/interpreters/python/mk-python-derivation.nix,
      # hooks/python-runtime-deps-check-hook.py); tests/eval/test_eval_nixos.py compares them.
      vmtests = pkgs.python3Packages.buildPythonApplication {
        pname = "vmtests";
        version = "0.1.0";
        pyproject = true;
        src = lib.cleanSource ./.;
        build-system = [ pkgs.python3Packages.setuptools ];
        dependencies = with pkgs.python3Packages; [
          pytest
          pexpect
          pyyaml
          requests
          qemu-qmp
          prometheus-client
        ];
        makeWrapperArgs = [
          "--prefix PATH : ${
            lib.makeBinPath [
              pkgs.openssh
              pkgs.qemu_kvm
            ]
          }"
        ];
        doCheck = false;
      };

      # How the VM switches to a target (the report records the command, hence which one ran):
      # - rebuild (default): `nixos-rebuild switch --flake` on this flake's source in the VM's
      #   store, with the nixpkgs input pinned to the store path of this flake's own input and no
      #   substituters, as nixpkgs' own nixos-rebuild tests run it offline
      #   (nixos/tests/installer.nix, switchToFlake); the target's toplevel is already in the
      #   image, so nothing is built in the VM;
      # - prebuilt (faster): the second half of it only, `nix-env --set` and
      #   `switch-to-configuration switch` of the pre-built toplevel (under systemd-run, below).
      switchCommands = profile: target: {
        # The backdoor's PATH is the tool manifest only (nixos/lib/systemd-lib.nix): call the
        # system's own nixos-rebuild by its path. --no-reexec: the re-exec would evaluate and
        # build the target's nixos-rebuild first (nixos-rebuild-ng, services.reexec).
        # --max-jobs 0: the target must evaluate to the toplevel in the image; if it does not
        # (another Nix, another fetcher), a missing output fails at once instead of building in
        # the VM. nixos-rebuild-ng parses `--max-jobs` as a string
        # (pkgs/by-name/ni/nixos-rebuild-ng/src/nixos_rebuild/__init__.py, common_flags) and
        # hands it to `nix build` (nix.py build_flake, utils.py dict_to_flags); the daemon
        # applies the client's max-jobs (Nix src/libstore/daemon.cc, ClientSettings::apply),
        # and with 0 every local build is refused: Nix >= 2.34.0 says "Cannot build '<drv>'.
        # Reason: local builds are disabled (max-jobs = 0)"
        # (src/libstore/build/derivation-building-goal.cc); older Nix says "Unable to start any
        # build; either increase '--max-jobs' or enable remote builds." after listing the
        # derivations it would build.
        rebuild = lib.escapeShellArgs [
          "/run/current-system/sw/bin/nixos-rebuild"
          "switch"
          "--no-reexec"
          "--flake"
          "${self.outPath}#vm-test-${profile}"
          "--override-input"
          "nixpkgs"
          "path:${nixpkgs.outPath}"
          "--no-write-lock-file"
          "--offline"
          "--max-jobs"
          "0"
          "--option"
          "substituters"
          ""
        ];
        # The activation runs as a transient unit of its own, as nixos-rebuild-ng runs it
        # (pkgs/by-name/ni/nixos-rebuild-ng/src/nixos_rebuild/nix.py,
        # SWITCH_TO_CONFIGURATION_CMD_PREFIX), so a dropped connection or the driver's timeout
        # cannot kill it halfway; the same prefix as the rollback's
        # (vmtests/scenario/install/generations.py, ACTIVATION_PREFIX).
        prebuilt = lib.concatStringsSep " " [
          "nix-env -p /nix/var/nix/profiles/system --set ${toplevel target} &&"
          (lib.escapeShellArgs [
            "systemd-run"
            "-E"
            "LOCALE_ARCHIVE"
            "-E"
            "NIXOS_INSTALL_BOOTLOADER=0"
            "-E"
            "NIXOS_NO_CHECK"
            "--collect"
            "--no-ask-password"
            "--pipe"
            "--quiet"
            "--service-type=exec"
            "--unit=vmtests-switch-to-configuration"
            "${toplevel target}/bin/switch-to-configuration"
            "switch"
          ])
        ];
      };

      # The shell lines that set $switch to the switch $VMTESTS_SWITCH picks, and the options of
      # the scenario on the base VM that every job passes, on one line for the caller to place:
      # the VM, the switch, the system it must activate, the module's container.
      vmScenario =
        profile: target:
        let
          commands = switchCommands profile target;
        in
        {
          pickSwitch = ''
            case "''${VMTESTS_SWITCH:-rebuild}" in
              rebuild) switch=${lib.escapeShellArg commands.rebuild} ;;
              prebuilt) switch=${lib.escapeShellArg commands.prebuilt} ;;
              *) echo "VMTESTS_SWITCH must be rebuild or prebuilt, not $VMTESTS_SWITCH" >&2; exit 2 ;;
            esac
            echo "vmtests: the switch command (VMTESTS_SWITCH=''${VMTESTS_SWITCH:-rebuild}): $switch" >&2
          '';
          options = lib.concatStringsSep " " [
            "--profile ${lib.escapeShellArg profile}"
            "--target ${lib.escapeShellArg "qemu-nixos:${vmBase.config.system.build.vm}/bin/run-${vmBase.config.system.name}-vm"}"
            ''--switch-command "$switch"''
            "--expected-system ${lib.escapeShellArg (toplevel target)}"
            "--container tenstorrent-serving"
          ];
        };
      # The main job for one serving profile: boot the base VM, switch it to the profile's target,
      # reboot, and prove every flag, variable and banner survived. The first argument is the
      # report directory; $VMTESTS_SWITCH picks the switch (rebuild, the default, or prebuilt);
      # --expected-system: the report says whether the VM then runs the pre-built target.
      # `nix run .#persistence` runs it for cfx-llm2; `nix flake check` runs it for every
      # profile (it needs KVM, like every NixOS VM test).
      persistence =
        profile: target:
        let
          scenario = vmScenario profile target;
        in
        pkgs.writeShellScript "vmtests-persistence-${profile}" ''
          ${scenario.pickSwitch}
          exec ${vmtests}/bin/vmtests run ${scenario.options} \
            --report-dir "''${1:-$PWD/vmtests-report-${profile}}"
        '';
      # `nix run .#shell`: the same VM and switch, brought to a stage of the scenario (S1 by
      # default: switched and checked) by `vmtests shell`, then a Python prompt with the machine
      # bound, or the guest's shell with --sh; the arguments go on to `vmtests shell`, where a
      # later option wins (`nix run .#shell -- --stage S2 --sh`). The profile, the VM, the switch
      # and the system it must activate belong together and are the app's: `shell-<profile>`
      # for another profile; --profile, --target, --switch-command, --expected-system and
      # --reference-switch are refused. Leaving it powers the VM off.
      shell =
        profile: target:
        let
          scenario = vmScenario profile target;
        in
        pkgs.writeShellScript "vmtests-shell-${profile}" ''
          for argument in "$@"; do
            case $argument in
              --profile | --profile=* | --target | --target=* | --switch-command | --switch-command=* | \
              --expected-system | --expected-system=* | --reference-switch)
                echo "vmtests-shell-${profile}: $argument is set by the app (its profile, VM, switch and system belong together; each profile has its own app, nix run .#shell-<profile>)" >&2
                exit 2 ;;
            esac
          done
          ${scenario.pickSwitch}
          exec ${vmtests}/bin/vmtests shell ${scenario.options} --stage S1 "$@"
        '';
      # The reports of one profile's main job, kept in the store whether it passes or fails:
      # with `succeedOnFailure` a failing run still produces its output and
      # `$out/nix-support/failed` holds the exit status (nixpkgs pkgs/stdenv/generic/setup.sh,
      # exitHandler; Hydra shows such a build as failed with output). The check below fails
      # on it, so `nix flake check` stays red, while the reports stay where CI can collect
      # them (scripts/flake-check-reports).
      # The run asks the driver for KVM (VMTESTS_ACCEL=kvm): where the builder cannot open
      # /dev/kvm, QEMU fails at once with its own error instead of emulating the guest into the
      # boot or switch timeout. The daemon offers the `kvm` feature when root can open /dev/kvm
      # (Nix src/libstore/globals.cc, getDefaultSystemFeatures), but a sandboxed build has no
      # supplementary groups (setgroups(0, 0) in NixOS/nix
      # src/libstore/linux/build/linux-derivation-builder.cc since 2.35; scripts/kvm-probe.nix
      # names the file in earlier versions), so a root:kvm 0660 /dev/kvm is closed to it; and
      # the run script's QEMU asks for `-machine accel=kvm:tcg` (nixpkgs
      # nixos/lib/qemu-common.nix, qemuBinaryWith), which falls back to TCG. The driver's
      # `-machine accel=kvm` comes later on QEMU's command line and wins
      # (vmtests/driver/qemu_launch.py, accel_args).
      # allowSubstitutes = false: a failed run is a successful build, so a binary cache holding
      # the report would hand it back and the VM would never run again; Nix then builds it
      # here instead of asking the substituters (src/libstore/derivation-options.cc,
      # substitutesAllowed, unless `always-allow-substitutes` is set; README, Continuous
      # integration: these paths are never pushed to a cache).
      # scripts/kvm-probe.nix reads its system features from here.
      persistenceReport =
        profile: target:
        pkgs.runCommand "vmtests-persistence-report-${profile}"
          {
            requiredSystemFeatures = [
              "kvm"
              "nixos-test"
            ];
            succeedOnFailure = true;
            allowSubstitutes = false;
          }
          ''
            export HOME=$TMPDIR
            export VMTESTS_ACCEL=kvm
            ${persistence profile target} $out
          '';
      persistenceCheck =
        profile: target:
        let
          report = persistenceReport profile target;
        in
        pkgs.runCommand "vmtests-persistence-${profile}" { passthru.report = report; } ''
          if [ -e ${report}/nix-support/failed ]; then
            cat ${report}/summary.md >&2 || true
            echo "persistence-${profile} failed (exit status $(cat ${report}/nix-support/failed)); its reports: ${report}" >&2
            # The failed run's reports are a valid store path: without this line a second check
            # would fail on them again, silently not running the VM.
            echo "this is the stored result of a run that failed; to run the VM again: nix store delete ${report} (scripts/flake-check-reports --forget-failed does it after copying the reports)" >&2
            exit 1
          fi
          ln -s ${report} $out
        '';

      # Evaluating a toplevel's drvPath runs every module assertion without building anything.
      evaluates =
        name: configuration:
        pkgs.writeText "${name}-evaluates" (
          builtins.unsafeDiscardStringContext (toplevel configuration).drvPath
        );
    in
    {
      nixosModules = {
        tenstorrent-serving = ./modules/tenstorrent-serving.nix;
        tenstorrent-stub = ./modules/tenstorrent-stub.nix;
        test-instrumentation = ./modules/test-instrumentation.nix;
        default = self.nixosModules.tenstorrent-serving;
      };

      nixosConfigurations = {
        cfx-llm2 = nixos [ ./hosts/cfx-llm2 ];
        vm-test-base = vmBase;
      }
      // lib.mapAttrs' (name: target: lib.nameValuePair "vm-test-${name}" target) vmTargets;

      checks.${system} = {
        # The builtins-only core for every serving profile: no failed assertion.
        core-profiles =
          let
            results = lib.mapAttrs (_: profile: import ./modules/serving/core.nix (import profile)) (
              servingProfiles // { baseline = ./hosts/profiles/baseline.nix; }
            );
            failing = lib.filterAttrs (_: result: result.failedAssertions != [ ]) results;
          in
          if failing == { } then
            pkgs.writeText "core-profiles.json" (builtins.toJSON results)
          else
            throw "serving profiles fail their assertions: ${builtins.toJSON (lib.mapAttrs (_: r: r.failedAssertions) failing)}";
        cfx-llm2-evaluates = evaluates "cfx-llm2" self.nixosConfigurations.cfx-llm2;
        vm-test-base-evaluates = evaluates "vm-test-base" vmBase;
      }
      // lib.mapAttrs' (name: target: lib.nameValuePair "vm-test-${name}-evaluates" (evaluates name target)) vmTargets
      // lib.mapAttrs' (name: target: lib.nameValuePair "persistence-${name}" (persistenceCheck name target)) vmTargets;

      packages.${system} = {
        inherit vmtests;
        default = vmtests;
        vm-test-base = vmBase.config.system.build.vm;
      }
      // lib.mapAttrs' (
        name: target: lib.nameValuePair "persistence-${name}" (persistence name target)
      ) vmTargets
      // lib.mapAttrs' (name: target: lib.nameValuePair "shell-${name}" (shell name target)) vmTargets;

      # `nix flake check` warns about an app without meta.description (Nix >= 2.26,
      # src/nix/flake.cc, checkApp), which must be a string without store paths.
      apps.${system} =
        let
          app = profile: target: {
            type = "app";
            program = "${persistence profile target}";
            meta.description = "Boot the NixOS test VM, switch it to the ${profile} serving profile, reboot it and prove the settings survived";
          };
          shellApp = profile: target: {
            type = "app";
            program = "${shell profile target}";
            meta.description = "Bring the NixOS test VM to a stage of the ${profile} scenario (S1 unless --stage says otherwise) and open a Python prompt on it, or its shell with --sh";
          };
        in
        {
          persistence = app "cfx-llm2" vmTargets.cfx-llm2;
          shell = shellApp "cfx-llm2" vmTargets.cfx-llm2;
        }
        // lib.mapAttrs' (name: target: lib.nameValuePair "persistence-${name}" (app name target)) vmTargets
        // lib.mapAttrs' (name: target: lib.nameValuePair "shell-${name}" (shellApp name target)) vmTargets;

      devShells.${system}.default = pkgs.mkShell {
        packages = [
          # The package's own dependencies (mk-python-derivation.nix keeps them in passthru),
          # and the dev tools the suite's pyproject.toml addopts and lint need (`-n`: xdist).
          (pkgs.python3.withPackages (
            ps:
            vmtests.dependencies
            ++ (with ps; [
              pytest-xdist
              mypy
              types-pyyaml
              types-requests
            ])
          ))
          pkgs.ruff
          pkgs.nix
          pkgs.qemu_kvm
          pkgs.openssh
          pkgs.nixfmt
        ];
      };

      formatter.${system} = pkgs.nixfmt;
    };
}

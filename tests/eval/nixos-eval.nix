# The full NixOS evaluation of this repository's flake, as one JSON document (read by
# vmtests/nixos_eval.py). Nothing is built: derivations are only instantiated (drvPath).
#
# - `nixpkgs`: a nixpkgs tree. The flake's `nixpkgs` input is emulated the way nixpkgs' own
#   flake.nix defines it (`lib.nixosSystem` = nixos/lib/eval-config.nix with `system = null`,
#   `legacyPackages.<system>` = the package set). With `shim = true` (a trimmed tree) the
#   test-only tests/eval/nixos-shim.nix is added to every configuration and its package stubs
#   to legacyPackages.
# - `nixpkgs = null`: the flake's own locked inputs (`builtins.getFlake`; a Nix host with flakes);
#   no shim.
# - `configurations`: names of the nixosConfigurations to describe (null: all of them);
#   `outputs = false` leaves out the checks, apps, packages, devShells and formatter.
{
  nixpkgs ? null,
  shim ? false,
  repo ? ../..,
  configurations ? null,
  outputs ? true,
}:
let
  system = "x86_64-linux";
  shimModule = ./nixos-shim.nix;
  contract = builtins.fromJSON (builtins.readFile (repo + "/vmtests/contracts/instrumentation.json"));

  treeInput =
    let
      lib0 = import (nixpkgs + "/lib");
      shimModules = lib0.optional shim shimModule;
      # The shim's package stubs, for the flake's own package set too.
      shimOverlays = lib0.optional shim (import ./nixos-shim-packages.nix);
    in
    {
      outPath = nixpkgs;
      # nixpkgs flake.nix: lib.nixosSystem.
      lib = lib0.extend (
        final: prev: {
          nixosSystem =
            args:
            import (nixpkgs + "/nixos/lib/eval-config.nix") (
              {
                lib = final;
                system = null;
                modules = args.modules ++ shimModules ++ [ { nixpkgs.flake.source = nixpkgs; } ];
              }
              // removeAttrs args [ "modules" ]
            );
        }
      );
      legacyPackages.${system} = import nixpkgs {
        inherit system;
        overlays = shimOverlays;
      };
    };

  flake =
    if nixpkgs == null then
      builtins.getFlake (toString repo)
    else
      let
        # A flake's self.outPath is its source in the store (git-tracked files); caches and
        # the worktree's .git link stay out of this copy.
        source = builtins.path {
          name = "source";
          path = repo;
          filter =
            path: _:
            !(builtins.elem (baseNameOf path) [
              ".git"
              "__pycache__"
              ".mypy_cache"
              ".ruff_cache"
              ".pytest_cache"
              "result"
            ]);
        };
        self = result // {
          outPath = source;
          inputs.nixpkgs = treeInput;
        };
        result = (import (repo + "/flake.nix")).outputs {
          inherit self;
          nixpkgs = treeInput;
        };
      in
      self;
  lib = (flake.inputs.nixpkgs or treeInput).lib;

  drvPath = drv: builtins.unsafeDiscardStringContext drv.drvPath;
  # The derivations a string (an app's program) depends on, instantiated.
  contextDrvs = s: builtins.attrNames (builtins.getContext s);

  # One systemd service as the configuration renders it: the unit file's text, plus the text of
  # every job script it runs (keyed by the script's store path, re-derived with nixpkgs' own
  # nixos/lib/systemd-lib.nix makeJobScript from the same options, so a path that matches is
  # exactly the script in the unit).
  unitView =
    configuration: name:
    let
      inherit (configuration.config.systemd) services units;
      service = services.${name};
      unit = units."${name}.service";
      utils = configuration._module.args.utils;
      jobs = {
        pre-start = service.preStart;
        start = service.script;
        post-start = service.postStart;
        reload = service.reload;
        pre-stop = service.preStop;
        post-stop = service.postStop;
      };
      script =
        suffix: text:
        utils.systemdUtils.lib.makeJobScript {
          name = "${name}-${suffix}";
          inherit text;
          inherit (service) enableStrictShellChecks;
        };
    in
    if units ? "${name}.service" then
      {
        text = unit.text;
        # When true, the job scripts are writeShellApplication (errexit, nounset, pipefail).
        strict = service.enableStrictShellChecks;
        # What systemd-lib.nix makes of the unit besides its text (nixos/lib/systemd-lib.nix
        # generateUnits): links beside the file, a /dev/null link when disabled, a drop-in when
        # asked for. Not covered: a drop-in because a package ships the same unit name, and
        # units in systemd.suppressedSystemUnits (neither applies to these project units).
        links = lib.filterAttrs (_: targets: targets != [ ]) {
          inherit (unit) requiredBy upheldBy aliases;
        };
        inherit (unit) enable overrideStrategy;
        scripts = lib.mapAttrs' (
          suffix: text: lib.nameValuePair (builtins.unsafeDiscardStringContext (script suffix text)) text
        ) (lib.filterAttrs (_: text: text != "") jobs);
      }
    else
      null;

  describe =
    name: configuration:
    let
      inherit (configuration) config pkgs;
      serving = config.services.tenstorrent-serving;
      virtualisation = config.virtualisation;
    in
    {
      toplevel = drvPath config.system.build.toplevel;
      vm = if config.system.build ? vm then drvPath config.system.build.vm else null;
      systemName = config.system.name;
      kernelParams = config.boot.kernelParams;
      consoleLogLevel = config.boot.consoleLogLevel;
      bootLoader = {
        systemdBoot = config.boot.loader.systemd-boot.enable;
        grub = config.boot.loader.grub.enable;
        efi = virtualisation.useEFIBoot or null;
        useBootLoader = virtualisation.useBootLoader or null;
      };
      resources = {
        memoryMB = virtualisation.memorySize or null;
        cpus = virtualisation.cores or null;
        diskSizeMB = virtualisation.diskSize or null;
      };
      firewall = {
        inherit (config.networking.firewall) enable allowedTCPPorts;
      };
      growRoot = {
        growPartition = config.boot.growPartition;
        autoResize = config.fileSystems."/".autoResize;
      };
      serving =
        if serving.enable then
          removeAttrs serving [ "imageFile" ]
          // {
            imageFile = if serving.imageFile == null then null else drvPath serving.imageFile;
          }
        else
          null;
      container =
        let
          c = config.virtualisation.oci-containers.containers.tenstorrent-serving or null;
        in
        if c == null then null else removeAttrs c [ "imageFile" "imageStream" "login" ];
      units = {
        backdoor = unitView configuration "vmtests-backdoor";
        serving = unitView configuration "tenstorrent-serving";
        hugepages = unitView configuration "tenstorrent-hugepages";
      };
      # The hugetlbfs mounts the configuration declares (systemd.mounts), by unit name.
      mounts = lib.listToAttrs (
        map (mount: lib.nameValuePair mount.name config.systemd.units.${mount.name}.text) (
          lib.filter (mount: mount.type == "hugetlbfs") config.systemd.mounts
        )
      );
      # The image file's store path, as the pre-start script names it (`docker load -i`).
      imageFilePath =
        if serving.enable && serving.imageFile != null then
          builtins.unsafeDiscardStringContext (toString serving.imageFile)
        else
          null;
      # The package each manifest program comes from, as this configuration's pkgs evaluates it.
      toolPackages = lib.mapAttrs (
        _: attr:
        builtins.unsafeDiscardStringContext (
          # A host without the instrumentation (production) takes every tool from pkgs.
          toString (lib.getBin (config.vmtests.instrumentation.resolvedToolPackages or pkgs).${attr})
        )
      ) contract.tools;
      toplevelOut = builtins.unsafeDiscardStringContext config.system.build.toplevel.outPath;
      additionalPaths = map (p: builtins.unsafeDiscardStringContext "${p}") (
        virtualisation.additionalPaths or [ ]
      );
      substituters = config.nix.settings.substituters or null;
      # Who defines the options the shim declares: never this repository.
      shimDefinitions = lib.optionalAttrs (nixpkgs != null && shim) (
        lib.mapAttrs (_: option: map toString option.files) {
          inherit (configuration.options.services) connman qemuGuest;
          inherit (configuration.options.virtualisation) hypervGuest;
        }
      );
      # The QEMU command the run-<name>-vm script execs, re-derived as
      # nixos/modules/virtualisation/qemu-vm.nix derives it (nixos/lib/qemu-common.nix,
      # qemuBinaryWith, with the configuration's QEMU package and forceAccel).
      qemuCommand =
        if config.system.build ? vm then
          builtins.unsafeDiscardStringContext (
            (import (pkgs.path + "/nixos/lib/qemu-common.nix") { inherit (pkgs) lib stdenv; })
            .qemuBinaryWith
              {
                qemuPkg = virtualisation.qemu.package;
                forceAccel = virtualisation.qemu.forceAccel or false;
              }
          )
        else
          null;
      dockerPackage = builtins.unsafeDiscardStringContext (toString config.virtualisation.docker.package);
      # The versions this configuration runs, under the keys of vmtests/scenario/runner/versions.py
      # (COMPONENTS): { version } or, where the evaluation cannot know it, { why }.
      versions =
        let
          dockerOn = config.virtualisation.docker.enable;
          docker = config.virtualisation.docker.package;
          kernel = config.boot.kernelPackages.kernel;
          stubbed = "stubbed by the trimmed nixpkgs tree (tests/eval/nixos-shim-packages.nix)";
          # A package without `version` gives a why, never a failed evaluation.
          known =
            name: package:
            let
              version = package.version or (lib.getVersion package);
            in
            if package.vmtestsEvalStub or false then
              { why = "${name} is ${stubbed}"; }
            else if version == "" then
              { why = "${name} has no version"; }
            else
              { inherit version; };
          notDocker = { why = "virtualisation.docker is off: the configuration runs no dockerd"; };
          # docker's own containerd (nixpkgs pkgs/applications/virtualization/docker/default.nix:
          # containerd.overrideAttrs with the source tag containerdRev) keeps the base package's
          # makeFlags "VERSION=v${version}" (pkgs/by-name/co/containerd/package.nix): the binary
          # claims the base version, whatever source it was built from.
          dockerContainerd =
            let
              dc = docker.docker-containerd;
              claimed = lib.removePrefix "VERSION=v" (
                lib.findFirst (lib.hasPrefix "VERSION=") "" (dc.makeFlags or [ ])
              );
              # fetchFromGitHub with `rev =` leaves tag null.
              rev = dc.src.rev or "";
              tag =
                if (dc.src.tag or null) != null then
                  dc.src.tag
                else
                  lib.removePrefix "refs/tags/" rev;
              source = lib.removePrefix "v" tag;
              fromTag = builtins.match "v[0-9].*" tag != null;
            in
            if !(docker ? docker-containerd) then
              { why = "docker's package names no containerd of its own (docker-containerd)"; }
            else if dc.vmtestsEvalStub or false then
              { why = "docker-containerd is ${stubbed}"; }
            else if claimed != "" && fromTag && claimed != source then
              { version = "${claimed} (built from ${tag} source)"; }
            else if claimed != "" && !fromTag && rev != "" then
              { version = "${claimed} (built from commit ${rev})"; }
            else if claimed != "" then
              { version = claimed; }
            else if fromTag then
              { version = source; }
            else
              { why = "docker-containerd is pinned to commit ${rev}"; };
        in
        {
          systemd = known "systemd" config.systemd.package;
          docker = if dockerOn then known "docker" docker else notDocker;
          containerd =
            if !dockerOn then
              notDocker
            else if config.virtualisation.docker.daemon.settings ? containerd then
              { why = "dockerd is set to the containerd at virtualisation.docker.daemon.settings.containerd"; }
            # dockerd uses the system containerd when /run/containerd/containerd.sock exists,
            # which virtualisation.containerd runs from pkgs.containerd
            # (nixpkgs nixos/modules/virtualisation/containerd.nix).
            else if config.virtualisation.containerd.enable or false then
              known "containerd" pkgs.containerd
            else
              dockerContainerd;
          # What /proc/sys/kernel/osrelease prints (nixpkgs pkgs/os-specific/linux/kernel/build.nix).
          kernel =
            if kernel.vmtestsEvalStub or false then
              { why = "the kernel is ${stubbed}"; }
            else
              { version = kernel.modDirVersion; };
          # nixos/modules/hardware/tenstorrent.nix installs pkgs.tt-smi.
          tt-smi =
            if config.hardware.tenstorrent.enable or false then
              known "tt-smi" pkgs.tt-smi
            else
              { why = "hardware.tenstorrent is off: the configuration runs the stub device layer (modules/tenstorrent-stub.nix)"; };
          vllm = {
            why =
              if !serving.enable then
                "the configuration serves nothing"
              else if config.hardware.tenstorrent-stub.enable or false then
                "the image ${serving.image} is the suite's stub vLLM server (modules/tenstorrent-stub.nix), whose version Nix does not know"
              else
                "the image ${serving.image} carries its own vLLM, whose version Nix does not know";
          };
        };
      # The raw attributes `versions` reads, for tests/eval/test_eval_versions.py to re-derive.
      versionSources = {
        dockerContainerdMakeFlags = map builtins.unsafeDiscardStringContext (
          config.virtualisation.docker.package.docker-containerd.makeFlags or [ ]
        );
        kernelModDirVersion = config.boot.kernelPackages.kernel.modDirVersion;
      };
      authorizedKeys = config.users.users.root.openssh.authorizedKeys.keys;
      sshd = config.services.openssh.enable;
      instrumented = config.vmtests.instrumentation.enable or false;
    };
  selected =
    if configurations == null then
      flake.nixosConfigurations
    else
      lib.getAttrs configurations flake.nixosConfigurations;
  # flake.lock's node for the root's `nixpkgs` input, if a lock is committed.
  lockedNixpkgs =
    let
      lock = builtins.fromJSON (builtins.readFile (repo + "/flake.lock"));
    in
    if builtins.pathExists (repo + "/flake.lock") then
      lock.nodes.${lock.nodes.${lock.root}.inputs.nixpkgs}
    else
      null;
in
{
  shim = nixpkgs != null && shim;
  configurations = lib.mapAttrs describe selected;
  # The nixpkgs the flake follows, and the release of the nixpkgs evaluated here (nixpkgs
  # lib/trivial.nix: `release` is the tree's .version): the eval tier fails when they disagree.
  nixpkgsInput = {
    url = (import (repo + "/flake.nix")).inputs.nixpkgs.url;
    evaluatedRelease = lib.trivial.release;
    locked = if lockedNixpkgs == null then null else lockedNixpkgs.original or null;
  };
}
// lib.optionalAttrs outputs {
  checks = lib.mapAttrs (_: drvPath) flake.checks.${system};
  # The persistence checks' reports, which stay in the store when their run fails; the
  # report's build script runs the VM.
  persistenceReports = lib.mapAttrs (_: check: {
    drv = drvPath check.report;
    succeedOnFailure = check.report.succeedOnFailure or false;
    # mkDerivation passes `false` on as "", which Nix reads as false; unset means true.
    allowSubstitutes = check.report.allowSubstitutes or true;
    features = check.report.requiredSystemFeatures or [ ];
    checkFeatures = check.requiredSystemFeatures or [ ];
    buildCommand = check.report.buildCommand;
  }) (lib.filterAttrs (_: check: check ? report) flake.checks.${system});
  # The scripts of the persistence jobs (their switch commands), and of the shells.
  persistenceScripts = lib.mapAttrs (_: script: script.text) (
    lib.filterAttrs (name: _: lib.hasPrefix "persistence-" name) flake.packages.${system}
  );
  shellScripts = lib.mapAttrs (_: script: script.text) (
    lib.filterAttrs (name: _: lib.hasPrefix "shell-" name) flake.packages.${system}
  );
  flakeSource = builtins.unsafeDiscardStringContext (toString flake.outPath);
  nixpkgsSource = builtins.unsafeDiscardStringContext "${flake.inputs.nixpkgs.outPath}";
  # The hugepage check of hosts/vm-test/common.nix, with the VM's memory halved to 4096 MB.
  smallVmAssertions =
    let
      small = flake.nixosConfigurations.vm-test-cfx-llm2.extendModules {
        modules = [ { virtualisation.memorySize = lib.mkForce 4096; } ];
      };
    in
    map (a: a.message) (lib.filter (a: !a.assertion) small.config.assertions);
  # The failed assertions and the warnings of vm-test-cfx-llm2 (1 GiB pages) with other
  # boot-time writers of hugepage pools (modules/tenstorrent-serving.nix).
  otherHugepageWriters =
    let
      messages =
        module:
        let
          inherit
            (flake.nixosConfigurations.vm-test-cfx-llm2.extendModules { modules = [ module ]; })
            config
            ;
        in
        {
          assertions = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
          inherit (config) warnings;
        };
    in
    {
      none = messages { };
      samePool = messages {
        boot.kernel.sysfs.kernel.mm.hugepages."hugepages-1048576kB".nr_hugepages = 4;
      };
      otherPool = messages {
        boot.kernel.sysfs.kernel.mm.hugepages."hugepages-2048kB".nr_hugepages = 4;
        boot.kernel.sysfs.devices.system.node.node0.hugepages."hugepages-2048kB".nr_hugepages = 4;
        # A glob that cannot match hugepages-1048576kB.
        boot.kernel.sysfs.kernel.mm.hugepages."hugepages-2048*".nr_hugepages = 4;
      };
      # Per NUMA node, by glob (nixos/modules/config/sysfs.nix allows globs per component), and
      # through nr_hugepages_mempolicy, with a value toString would print as nothing.
      perNode = messages {
        boot.kernel.sysfs.devices.system.node.node0.hugepages."hugepages-1048576kB".nr_hugepages = 2;
        boot.kernel.sysfs.devices.system.node."node[1-3]".hugepages."hugepages-*".nr_hugepages = 1;
        boot.kernel.sysfs.kernel.mm.hugepages."hugepages-1048576kB".nr_hugepages_mempolicy = false;
      };
      sysctl = messages { boot.kernel.sysctl."vm.nr_hugepages" = 16; };
    };
  # The failed assertions of vm-test-cfx-llm2 with a registry login for the serving container,
  # which the module's pre-start (replacing oci-containers') would ignore.
  containerLogin =
    let
      inherit
        (flake.nixosConfigurations.vm-test-cfx-llm2.extendModules {
          modules = [
            {
              virtualisation.oci-containers.containers.tenstorrent-serving.login = {
                username = "ci";
                passwordFile = "/run/keys/registry";
                registry = "registry.example.org";
              };
            }
          ];
        })
        config
        ;
    in
    map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
  apps = lib.mapAttrs (_: app: contextDrvs app.program) flake.apps.${system};
  # What `nix flake check` reads of an app besides its program (Nix src/nix/flake.cc, checkApp):
  # its attribute names and meta.description, a string without context.
  appDefinitions = lib.mapAttrs (_: app: {
    attributes = builtins.attrNames app;
    description = app.meta.description or null;
    descriptionHasContext = builtins.hasContext (app.meta.description or "");
  }) flake.apps.${system};
  # The flake-check job's preflight probe (scripts/kvm-probe.nix), from this flake, whose checks
  # it may read only as far as the reports' system features: anything more throws, for the
  # other checks evaluate whole NixOS systems and the reports' build commands the VMs.
  kvmProbe =
    let
      guarded = lib.mapAttrs (
        name: check:
        if check ? report then
          { report = { inherit (check.report) requiredSystemFeatures; }; }
        else
          throw "scripts/kvm-probe.nix evaluates the check ${name}"
      ) flake.checks.${system};
      probe = import (repo + "/scripts/kvm-probe.nix") {
        flake = flake // {
          checks.${system} = guarded;
        };
        stamp = "eval";
      };
    in
    {
      drv = drvPath probe;
      features = probe.requiredSystemFeatures or [ ];
      buildCommand = probe.buildCommand;
    };
  packages = lib.mapAttrs (_: drvPath) flake.packages.${system};
  # The pnames of the Python packages the vmtests package depends on (passthru.dependencies,
  # pkgs/development/interpreters/python/mk-python-derivation.nix) and of every Python package in
  # the devShell's environments (python.withPackages: a buildEnv whose passthru.paths are
  # requiredPythonModules of its packages, pkgs/development/interpreters/python/wrapper.nix).
  pythonDependencies = {
    package = map (drv: drv.pname) flake.packages.${system}.default.dependencies;
    devShell = lib.concatMap (env: map (drv: drv.pname or drv.name) env.paths) (
      lib.filter (drv: drv ? paths) flake.devShells.${system}.default.nativeBuildInputs
    );
  };
  devShells = lib.mapAttrs (_: drvPath) flake.devShells.${system};
  formatter = drvPath flake.formatter.${system};
}

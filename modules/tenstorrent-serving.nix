# services.tenstorrent-serving: vLLM + the Tenstorrent plugin on a P150, run as a container by
# virtualisation.oci-containers, with every validated setting declared (serve issue #52).
#
# All flag and environment logic lives in ./serving/core.nix (builtins only, tested without
# nixpkgs); this module only declares the options and wires the core's output into NixOS:
# the container, its graceful stop, the boot-time hugepage reservation and the startup banner.
{
  config,
  options,
  lib,
  utils,
  ...
}:
let
  inherit (lib) mkOption types;
  cfg = config.services.tenstorrent-serving;
  defaults = import ./serving/defaults.nix;
  core = import ./serving/core.nix cfg;

  name = "tenstorrent-serving";
  backend = config.virtualisation.oci-containers.backend;
  stopTimeout = toString core.stopTimeout;
  hugepages = core.hugepages;
  hugepageMount = "/dev/hugepages-${cfg.hugepages.size}";
  hugepageUnit = "tenstorrent-hugepages.service";

  # Other writers of hugepage pools at boot. boot.kernel.sysfs (nixpkgs
  # nixos/modules/config/sysfs.nix) writes /sys attributes, named one path component per
  # attribute and possibly by glob, from nixos-sysfs@ services that path units start once the
  # attribute exists (the path units are ordered before sysinit.target, the services nowhere):
  # they race this reservation on the same pool. A pool of one page size is resized through
  # kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages or nr_hugepages_mempolicy, or per NUMA
  # node through devices/system/node/node<N>/hugepages/hugepages-<size>kB/nr_hugepages (kernel
  # Documentation/admin-guide/mm/hugetlbpage.rst), so a setting counts whose last two
  # components may name one of those attributes and that size's directory.
  # boot.kernel.sysctl."vm.nr_hugepages" and "vm.nr_hugepages_mempolicy", dot- or
  # slash-separated (sysctl.d(5); nixos/modules/config/sysctl.nix writes names as given, applied
  # by systemd-sysctl.service), size the pool of the default page size. Read only where those
  # options are declared: tests/eval/module-eval.nix evaluates this module without nixpkgs'
  # modules. Not checked: a `w` line in systemd.tmpfiles.rules naming the pool, which
  # systemd-tmpfiles-setup.service writes just as unordered against this reservation.
  declared = path: lib.hasAttrByPath path options;
  # Values as Nix shows them: toString would print false and "" alike as nothing.
  showValue = lib.generators.toPretty { multiline = false; };
  # `component` is `name`, or a glob (a `*`, `?` or `[`, as sysfs.nix's hasGlob sees them) whose
  # literal text before its first wildcard begins `name`, and so may match it.
  mayName =
    name: component:
    component == name
    || (
      builtins.match ".*[*?[].*" component != null
      && lib.hasPrefix (lib.head (builtins.split "[*?[]" component)) name
    );
  writesReservedPool =
    path:
    lib.length path >= 2
    && lib.any (attribute: mayName attribute (lib.last path)) [
      "nr_hugepages"
      "nr_hugepages_mempolicy"
    ]
    && mayName "hugepages-${toString hugepages.sizeKiB}kB" (lib.elemAt path (lib.length path - 2));
  # The sysfs settings that write the reserved pool, as "a.b.c (value)", walked as sysfs.nix
  # walks them (mapAttrsToListRecursive; null values are ignored there too). The path is tested
  # first, so that no other setting's value is forced here.
  sysfsPoolWriters =
    let
      walk =
        path: value:
        if lib.isAttrs value && !lib.isDerivation value then
          lib.concatLists (lib.mapAttrsToList (name: walk (path ++ [ name ])) value)
        else
          lib.optional (writesReservedPool path && value != null) "boot.kernel.sysfs.${
            lib.concatMapStringsSep "." lib.strings.escapeNixIdentifier path
          } (${showValue value})";
    in
    if hugepages == null || !declared [ "boot" "kernel" "sysfs" ] then
      [ ]
    else
      walk [ ] config.boot.kernel.sysfs;
  sysctlPoolWriters =
    if hugepages == null || !declared [ "boot" "kernel" "sysctl" ] then
      [ ]
    else
      lib.concatMap
        (
          key:
          let
            value = config.boot.kernel.sysctl.${key} or null;
          in
          lib.optional (value != null) "boot.kernel.sysctl.${lib.strings.escapeNixIdentifier key} (${showValue value})"
        )
        [
          "vm.nr_hugepages"
          "vm/nr_hugepages"
          "vm.nr_hugepages_mempolicy"
          "vm/nr_hugepages_mempolicy"
        ];

  # nixpkgs' oci-containers (nixos/modules/virtualisation/oci-containers.nix) stops with a bare
  # `docker stop` (10 s, then SIGKILL) and then `docker rm -f`. The advisory wants
  # `docker stop -t 60`, never `rm -f`, so both are replaced: ExecStop waits the full grace
  # period, ExecStopPost only removes a container that is stopped.
  #
  # The stop returns once the container has stopped; the attached client (the unit's main
  # process) exits with the container's status a moment later. systemd SIGTERMs whatever still
  # runs when ExecStop ends (systemd.kill(5)), which turned a graceful stop into "ended by
  # signal 15" now and then under load, so ExecStop waits for $MAINPID (set for ExecStop=,
  # systemd.exec(5)), bounded by TimeoutStopSec.
  # `''${MAINPID:-}`: empty, not unbound, under enableStrictShellChecks (nounset) when the
  # main process already ended; the wait runs only after a stop that succeeded (`|| exit 0`),
  # so a failed stop still hands over to systemd's SIGTERM at once.
  waitForMainProcess = ''while kill -0 "''${MAINPID:-}" 2>/dev/null; do sleep 0.2; done'';
  stopCommand =
    if backend == "podman" then
      ''
        podman stop --ignore -t ${stopTimeout} --cidfile=/run/${name}/ctr-id || exit 0
        ${waitForMainProcess}
      ''
    else
      ''
        docker stop -t ${stopTimeout} ${name} || exit 0
        ${waitForMainProcess}
      '';
  postStopCommand =
    if backend == "podman" then
      ''
        podman stop --ignore -t ${stopTimeout} --cidfile=/run/${name}/ctr-id
        podman rm --ignore --cidfile=/run/${name}/ctr-id
      ''
    else
      # Usually gone already: the attached `docker run --rm` exits only once Docker has
      # removed the container, so one inspect ends the script (each `docker` start costs).
      ''
        state=$(docker container inspect --format '{{.State.Running}}' ${name} 2>/dev/null) || exit 0
        if [ "$state" = true ]; then docker stop -t ${stopTimeout} ${name} >/dev/null 2>&1 || true; fi
        docker rm ${name} >/dev/null 2>&1 || true
      '';

  # oci-containers' own ExecStartPre (`pre-start`, a writeShellApplication) runs
  # `<backend> rm -f <name>` and then loads imageFile. It is replaced by this one: the module's
  # banner first, then a container left over from an earlier start (a crash of the unit, a
  # manual `docker run`) is stopped gracefully with the full grace period and removed only once
  # stopped, then the image file is loaded unless the backend already holds it (loadImage).
  preStartCommands =
    ''
      echo ${lib.escapeShellArg core.banner}
    ''
    + (
      if backend == "podman" then
        ''
          podman stop --ignore -t ${stopTimeout} ${name}
          podman rm --ignore ${name}
          rm -f /run/${name}/ctr-id
        ''
      else
        ''
          state=$(docker container inspect --format '{{.State.Running}}' ${name} 2>/dev/null) || state=none
          if [ "$state" = true ]; then
            echo "stopping the leftover container ${name} gracefully (docker stop -t ${stopTimeout})"
            # It may end by itself (and --rm remove it) between the inspect and the stop.
            docker stop -t ${stopTimeout} ${name} || { [ "$(docker container inspect --format '{{.State.Running}}' ${name} 2>/dev/null)" != true ]; echo "the leftover container ${name} had already ended"; }
          fi
          # Only a stopped container is left here. With --rm, Docker may still be removing it
          # after the stop returned: wait (50 looks at most) until its name is free.
          if [ "$state" != none ]; then
            docker rm ${name} >/dev/null 2>&1 || true
            for _ in $(seq 50); do docker container inspect ${name} >/dev/null 2>&1 || break; sleep 0.2; done
          fi
        ''
    )
    + lib.optionalString (cfg.imageFile != null) loadImage;

  # oci-containers loads imageFile at every start, and `<backend> load` reads and hashes the
  # whole archive each time (a vLLM image is many GB). Load it only when the backend does not
  # hold the image this file gave at its last load: the stamp, under /run so that every boot
  # loads once, records the file's store path and the image ID it was loaded as.
  loadStamp = "/run/${name}/loaded-image";
  imageId = "${backend} image inspect --format '{{.Id}}' ${lib.escapeShellArg cfg.image}";
  # No stamp without an ID: an empty one would later match a missing image and skip a load.
  loadImage = ''
    if [ "$(cat ${loadStamp} 2>/dev/null)" != "${cfg.imageFile} $(${imageId} 2>/dev/null)" ]; then
      ${backend} load -i ${cfg.imageFile}
      if id=$(${imageId}); then
        mkdir -p /run/${name}
        echo "${cfg.imageFile} $id" > ${loadStamp}
      fi
    fi
  '';
  # The same job script that nixos/lib/systemd-unit-options.nix makes of `preStart`, so that the
  # unit's only ExecStartPre is the store path of `preStart`'s script; made of the merged
  # `preStart`, so that lines another module adds to it still run.
  preStartScript = utils.systemdUtils.lib.makeJobScript {
    name = "${name}-pre-start";
    text = config.systemd.services.${name}.preStart;
    inherit (config.systemd.services.${name}) enableStrictShellChecks;
  };
  # What oci-containers' pre-start does besides `rm -f` and loading imageFile, and the one above
  # does not: log in to a registry (`login`, once username, passwordFile and registry are all
  # set: isValidLogin) and load `imageStream`. Refused, not dropped in silence.
  container = config.virtualisation.oci-containers.containers.${name};
  ignoredContainerSettings =
    lib.optional ((container.imageStream or null) != null) "imageStream"
    ++ lib.optional (lib.all (key: (container.login.${key} or null) != null) [
      "username"
      "passwordFile"
      "registry"
    ]) "login";

  option =
    key: type: description:
    mkOption {
      inherit type description;
      default = defaults.${key};
    };
  featureOption =
    key: what:
    option key types.bool "${what} Sets the container variable named by `environmentNames.${key}` (default `${defaults.environmentNames.${key}}`).";
in
{
  options.services.tenstorrent-serving = {
    enable = lib.mkEnableOption "the Tenstorrent vLLM serving container (tenstorrent-serving.service)";
    image = option "image" types.str "OCI image that runs vLLM with the Tenstorrent plugin.";
    imageFile =
      option "imageFile" (types.nullOr types.package)
        "Image archive loaded before start (offline hosts, VM tests); its name:tag must equal `image`.";
    model = option "model" types.str "Model path or id passed as `--model`.";
    servedModelName =
      option "servedModelName" (types.nullOr types.str)
        "Name clients use (`--served-model-name`); null leaves vLLM's default.";
    host = option "host" types.str "Address vLLM listens on (`--host`; the container uses host networking).";
    port = option "port" types.port "Port vLLM listens on (`--port`).";
    openFirewall =
      option "openFirewall" types.bool
        "Open `port` in the NixOS firewall (`networking.firewall.allowedTCPPorts`), which is on by default and drops every client that is not on the host itself.";
    devices =
      option "devices" (types.listOf types.str)
        "Tenstorrent device nodes passed to the container with `--device`.";
    blockSize = option "blockSize" (types.nullOr types.ints.positive) "`--block-size` (64 for qwen36).";
    maxModelLen = option "maxModelLen" (types.nullOr types.ints.positive) "`--max-model-len`, null for vLLM's default.";
    maxNumSeqs = option "maxNumSeqs" (types.nullOr types.ints.positive) "`--max-num-seqs`, null for vLLM's default.";

    enablePrefixCaching =
      option "enablePrefixCaching" types.bool
        "Pass `--enable-prefix-caching --mamba-cache-mode <mambaCacheMode>` (else `--no-enable-prefix-caching`). Implies synchronous scheduling.";
    mambaCacheMode =
      option "mambaCacheMode" (types.enum [ "all" "align" "none" ])
        "`--mamba-cache-mode` used with prefix caching; `\"none\"` with prefix caching is an assertion failure (vLLM would switch it to `align`).";
    asyncScheduling =
      option "asyncScheduling" (types.nullOr types.bool)
        "`--async-scheduling` (true) / `--no-async-scheduling` (false). null = automatic: `--no-async-scheduling` whenever prefix caching is on (prefix sidecars require synchronous local execution); true with prefix caching is an assertion failure.";

    deviceResident = featureOption "deviceResident" "Phase 2a device-resident decode chain. Requires `deviceArgmax`; see hosts/profiles/resident.nix for why it is not the production default.";
    deviceArgmax = featureOption "deviceArgmax" "On-device argmax sampling.";
    sdpaStreaming = featureOption "sdpaStreaming" "SDPA streaming.";
    mergeBatchGuard = featureOption "mergeBatchGuard" "Merge batch guard (#45).";
    environmentNames =
      option "environmentNames" (types.attrsOf types.str)
        "Container variable name of each feature switch; defaults come from modules/serving/features.json. Override one if the image expects another name.";

    toolCalling = {
      enable = mkOption {
        type = types.bool;
        default = defaults.toolCalling.enable;
        description = "Tool calling: `--enable-auto-tool-choice --tool-call-parser <parser>`.";
      };
      parser = mkOption {
        type = types.nullOr types.str;
        default = defaults.toolCalling.parser;
        description = "`--tool-call-parser` (Qwen3.6: qwen3_coder). Required when tool calling is on.";
      };
    };

    hugepages = {
      count = mkOption {
        type = types.ints.unsigned;
        default = defaults.hugepages.count;
        description = "Hugepages reserved at boot by a sysinit-ordered oneshot (0 = none); mounted as hugetlbfs on /dev/hugepages-<size> and passed to the container.";
      };
      size = mkOption {
        type = types.enum [ "1G" "2M" ];
        default = defaults.hugepages.size;
        description = "Hugepage size.";
      };
    };

    extraArgs =
      option "extraArgs" (types.listOf types.str)
        "More vLLM arguments, appended last. Flags the module manages are rejected.";
    extraEnvironment =
      option "extraEnvironment" (types.attrsOf types.str)
        "More container variables. Feature variables are rejected: use the feature options.";
    extraOptions =
      option "extraOptions" (types.listOf types.str)
        "More `docker run` options (one token each, e.g. `--volume=/srv/models:/models:ro`).";
    stopTimeout =
      option "stopTimeout" types.ints.positive
        "Graceful stop in seconds (`docker stop -t`); systemd's stop timeout is set 30 s above it.";
  };

  config = lib.mkIf cfg.enable {
    assertions =
      map (message: {
        assertion = false;
        inherit message;
      }) core.failedAssertions
      ++ lib.optional (hugepages != null) (
        let
          one = lib.length sysfsPoolWriters == 1;
        in
        {
          assertion = sysfsPoolWriters == [ ];
          message = "${lib.concatStringsSep ", " sysfsPoolWriters} ${if one then "writes" else "write"} the pool that services.tenstorrent-serving.hugepages reserves (${toString hugepages.count} x ${hugepages.size} in hugepages-${toString hugepages.sizeKiB}kB; a glob counts where it may match), and both write it at boot in no set order: ${if one then "remove that boot.kernel.sysfs setting (or narrow its glob)" else "remove those boot.kernel.sysfs settings (or narrow their globs)"} and set services.tenstorrent-serving.hugepages.count instead.";
        }
      )
      ++ [
        {
          assertion = ignoredContainerSettings == [ ];
          message = "${lib.concatMapStringsSep " and " (setting: "virtualisation.oci-containers.containers.${name}.${setting}") ignoredContainerSettings} would be ignored: services.tenstorrent-serving replaces oci-containers' pre-start script, which is what logs in to a registry and loads imageStream (nixos/modules/virtualisation/oci-containers.nix), so that a leftover container is stopped gracefully, never removed with rm -f. Unset it, and give the image as services.tenstorrent-serving.imageFile or pull it on the host beforehand.";
        }
      ];
    warnings =
      core.warnings
      ++ lib.optional (sysctlPoolWriters != [ ])
        "${lib.concatStringsSep ", " sysctlPoolWriters} also ${if lib.length sysctlPoolWriters == 1 then "sizes" else "size"} a hugepage pool at boot, that of the default page size: if that is ${hugepages.size}, services.tenstorrent-serving.hugepages sets it back to ${toString hugepages.count} right after at boot (tenstorrent-hugepages.service runs after systemd-sysctl.service), but a switch that changes sysctl settings restarts systemd-sysctl.service and resizes the pool again until the next boot (nixos/modules/config/sysctl.nix, restartTriggers); otherwise its pages are taken from the memory the serving profile leaves free. Remove it, or set services.tenstorrent-serving.hugepages alone.";

    # nixos/modules/services/networking/firewall.nix: the firewall is on by default, and
    # `--network=host` gives the container no INPUT rule of its own.
    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    virtualisation.oci-containers.backend = lib.mkDefault "docker";
    virtualisation.oci-containers.containers.${name} = {
      inherit (cfg) image imageFile;
      serviceName = name;
      cmd = core.args;
      environment = core.environment;
      log-driver = "journald";
      extraOptions =
        map (device: "--device=${device}") cfg.devices
        ++ lib.optional (hugepages != null) "--volume=${hugepageMount}:${hugepageMount}"
        ++ [
          "--ipc=host"
          "--network=host"
          # Docker's own stops (daemon shutdown, `docker stop` without -t) wait this long
          # before SIGKILL too, not Docker's default of 10 s.
          "--stop-timeout=${stopTimeout}"
        ]
        ++ cfg.extraOptions;
    };

    systemd.services.${name} = {
      # The module's own banner, first in this boot's journal of the unit, then the graceful
      # removal of a leftover container and the image load (see preStartCommands).
      preStart = preStartCommands;
      serviceConfig.ExecStartPre = lib.mkForce [ preStartScript ];
      preStop = lib.mkForce stopCommand;
      postStop = lib.mkForce postStopCommand;
      serviceConfig.TimeoutStopSec = lib.mkForce (core.stopTimeout + 30);
      # podman's RuntimeDirectory (oci-containers.nix) is /run/${name}, which systemd empties at
      # every stop: keep it, and the load stamp in it, until reboot. The preStart above still
      # removes a stale ctr-id before `podman run --cidfile`.
      serviceConfig.RuntimeDirectoryPreserve = lib.mkIf (backend == "podman") "yes";
      after = lib.optional (hugepages != null) hugepageUnit;
      requires = lib.optional (hugepages != null) hugepageUnit;
      # A list: nixpkgs' unitOption concatenates lists, but two different strings conflict, and
      # oci-containers sets RequiresMountsFor itself for a rootless podman container.
      unitConfig.RequiresMountsFor = lib.mkIf (hugepages != null) [ hugepageMount ];
    };

    # Reserved at boot, never at runtime only: the production reduction was lost that way (#49).
    systemd.services.tenstorrent-hugepages = lib.mkIf (hugepages != null) {
      description = "Reserve ${toString hugepages.count} x ${hugepages.size} hugepages for ${name}";
      wantedBy = [ "sysinit.target" ];
      before = [
        "sysinit.target"
        "shutdown.target"
      ];
      # After boot.kernel.sysctl's writer (see sysctlPoolWriters), so that this count is the last
      # word on the pool.
      after = [ "systemd-sysctl.service" ];
      conflicts = [ "shutdown.target" ];
      unitConfig.DefaultDependencies = false;
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
      };
      script = ''
        pool=/sys/kernel/mm/hugepages/hugepages-${toString hugepages.sizeKiB}kB
        if [ ! -d "$pool" ]; then
          echo "$pool is missing: this CPU/kernel offers no ${hugepages.size} pages" >&2
          exit 1
        fi
        # A 1 GiB page needs a free, aligned region, which a running system's memory seldom
        # has: while pages are missing, free the page cache and compact memory (kernel
        # Documentation/admin-guide/sysctl/vm.rst) before each of three tries. At boot little is
        # cached yet; a pool that holds enough pages drops no cache (it is set to the count).
        for _ in 1 2 3; do
          if [ "$(cat "$pool/nr_hugepages")" -lt ${toString hugepages.count} ]; then
            sync
            # Only an aid: a read-only /proc/sys must not end the tries (the check decides).
            echo 3 > /proc/sys/vm/drop_caches || true
            if [ -e /proc/sys/vm/compact_memory ]; then echo 1 > /proc/sys/vm/compact_memory || true; fi
          fi
          if ! echo ${toString hugepages.count} > "$pool/nr_hugepages"; then
            echo "cannot write $pool/nr_hugepages" >&2
            exit 1
          fi
          got=$(cat "$pool/nr_hugepages")
          if [ "''${got:-0}" -eq ${toString hugepages.count} ]; then break; fi
        done
        if [ "''${got:-0}" -ne ${toString hugepages.count} ]; then
          echo "reserved ''${got:-0} of ${toString hugepages.count} ${hugepages.size} hugepages" >&2
          exit 1
        fi
        echo "reserved ${toString hugepages.count} x ${hugepages.size} hugepages"
      '';
    };

    systemd.mounts = lib.optional (hugepages != null) {
      description = "hugetlbfs with ${hugepages.size} pages for ${name}";
      what = "hugetlbfs";
      where = hugepageMount;
      type = "hugetlbfs";
      options = "pagesize=${hugepages.size}";
      wantedBy = [ "sysinit.target" ];
      before = [ "sysinit.target" ];
      after = [ hugepageUnit ];
      unitConfig.DefaultDependencies = false;
    };
  };
}

# The builtins-only core of services.tenstorrent-serving: option values -> what the container
# runs. No nixpkgs, so `nix-instantiate --eval --strict --json` evaluates it anywhere:
#
#   nix-instantiate --eval --strict --json \
#     -E 'import ./modules/serving/core.nix (import ./hosts/profiles/cfx-llm2.nix)'
#
# `values` is a (partial) attrset of option values; missing ones come from defaults.nix. The
# module calls this and contains no flag logic of its own. Returns
# { args environment banner digest hugepages stopTimeout failedAssertions warnings }.
values:
let
  defaults = import ./defaults.nix;
  features = builtins.fromJSON (builtins.readFile ./features.json);
  featureKeys = builtins.attrNames features.environment;
  opt = "services.tenstorrent-serving";

  optional = condition: list: if condition then list else [ ];
  elem = builtins.elem;

  # Expected builtins.typeOf of each value: the module's option types do this for NixOS; this
  # table does it for plain nix-instantiate callers, so mistakes become assertions, not crashes.
  types = {
    enable = [ "bool" ];
    image = [ "string" ];
    imageFile = [ "null" "path" "string" "set" ];
    model = [ "string" ];
    servedModelName = [ "null" "string" ];
    host = [ "string" ];
    port = [ "int" ];
    openFirewall = [ "bool" ];
    devices = [ "list" ];
    blockSize = [ "null" "int" ];
    maxModelLen = [ "null" "int" ];
    maxNumSeqs = [ "null" "int" ];
    enablePrefixCaching = [ "bool" ];
    mambaCacheMode = [ "string" ];
    asyncScheduling = [ "null" "bool" ];
    deviceResident = [ "bool" ];
    deviceArgmax = [ "bool" ];
    sdpaStreaming = [ "bool" ];
    mergeBatchGuard = [ "bool" ];
    environmentNames = [ "set" ];
    toolCalling = [ "set" ];
    hugepages = [ "set" ];
    extraArgs = [ "list" ];
    extraEnvironment = [ "set" ];
    extraOptions = [ "list" ];
    stopTimeout = [ "int" ];
  };
  nestedTypes = {
    toolCalling = {
      enable = [ "bool" ];
      parser = [ "null" "string" ];
    };
    hugepages = {
      count = [ "int" ];
      size = [ "string" ];
    };
    environmentNames = builtins.mapAttrs (_: _: [ "string" ]) features.environment;
  };
  mambaCacheModes = [ "all" "align" "none" ];
  hugepageSizesKiB = {
    "1G" = 1048576;
    "2M" = 2048;
  };

  input =
    if builtins.isAttrs values then
      values
    else
      throw "core.nix: expected an attrset of ${opt} option values, got a ${builtins.typeOf values}";
  typeOk = name: value: types ? ${name} && elem (builtins.typeOf value) types.${name};
  nestedOk =
    name: key: value:
    nestedTypes.${name} ? ${key} && elem (builtins.typeOf value) nestedTypes.${name}.${key};

  # Ill-typed values fall back to their default so the outputs still evaluate and the type error
  # is reported as a failed assertion below.
  cfg = builtins.mapAttrs (
    name: default:
    let
      value = input.${name} or default;
    in
    if !(typeOk name value) then
      default
    else if nestedTypes ? ${name} then
      default // builtins.mapAttrs (key: v: if nestedOk name key v then v else default.${key}) value
    else
      value
  ) defaults;

  typeErrors =
    builtins.concatMap (
      name:
      if !(types ? ${name}) then
        [
          "${opt}.${name} is not an option (known: ${builtins.concatStringsSep ", " (builtins.attrNames defaults)})"
        ]
      else if !(typeOk name input.${name}) then
        [
          "${opt}.${name} must be one of ${builtins.toJSON types.${name}}, got a ${builtins.typeOf input.${name}}"
        ]
      else
        builtins.concatMap (
          key:
          optional (!(nestedOk name key input.${name}.${key})) [
            (
              if nestedTypes.${name} ? ${key} then
                "${opt}.${name}.${key} must be one of ${builtins.toJSON nestedTypes.${name}.${key}}, got a ${builtins.typeOf input.${name}.${key}}"
              else
                "${opt}.${name}.${key} is not an option (known: ${builtins.concatStringsSep ", " (builtins.attrNames nestedTypes.${name})})"
            )
          ]
        ) (optional (nestedTypes ? ${name}) (builtins.attrNames input.${name}))
    ) (builtins.attrNames input);

  prefix = cfg.enablePrefixCaching;
  # What scheduling the server gets: an explicit choice wins, else synchronous under prefix
  # caching (prefix sidecars require synchronous local execution), else vLLM's own default.
  asyncEffective =
    if cfg.asyncScheduling != null then
      cfg.asyncScheduling
    else if prefix then
      false
    else
      null;
  tools = cfg.toolCalling;
  hugepageSizeKiB = hugepageSizesKiB.${cfg.hugepages.size} or null;

  args =
    [
      "--model"
      cfg.model
    ]
    ++ optional (cfg.servedModelName != null) [
      "--served-model-name"
      cfg.servedModelName
    ]
    ++ [
      "--host"
      cfg.host
      "--port"
      (toString cfg.port)
    ]
    ++ optional (cfg.blockSize != null) [
      "--block-size"
      (toString cfg.blockSize)
    ]
    ++ optional (cfg.maxModelLen != null) [
      "--max-model-len"
      (toString cfg.maxModelLen)
    ]
    ++ optional (cfg.maxNumSeqs != null) [
      "--max-num-seqs"
      (toString cfg.maxNumSeqs)
    ]
    # Explicit either way, so the state is declared rather than left to vLLM's default.
    ++ (
      if prefix then
        [
          "--enable-prefix-caching"
          "--mamba-cache-mode"
          cfg.mambaCacheMode
        ]
      else
        [ "--no-enable-prefix-caching" ]
    )
    ++ optional (asyncEffective == true) [ "--async-scheduling" ]
    ++ optional (asyncEffective == false) [ "--no-async-scheduling" ]
    ++ optional tools.enable (
      [ "--enable-auto-tool-choice" ]
      ++ optional (tools.parser != null) [
        "--tool-call-parser"
        tools.parser
      ]
    )
    ++ cfg.extraArgs;

  enabledFeatures = builtins.filter (feature: cfg.${feature}) featureKeys;
  featureEnvironment = builtins.listToAttrs (
    map (feature: {
      name = cfg.environmentNames.${feature};
      value = features.environment.${feature}.value;
    }) enabledFeatures
  );
  environment = featureEnvironment // cfg.extraEnvironment;

  hugepages =
    if cfg.hugepages.count > 0 && hugepageSizeKiB != null then
      {
        inherit (cfg.hugepages) count size;
        sizeKiB = hugepageSizeKiB;
      }
    else
      null;

  digest = "sha256:" + builtins.hashString "sha256" (builtins.toJSON { inherit args environment; });

  onOff = flag: if flag then "on" else "off";
  banner = builtins.concatStringsSep " " [
    features.moduleBanner.tag
    "prefix-caching=${onOff prefix}"
    "mamba-cache-mode=${if prefix then cfg.mambaCacheMode else "none"}"
    "async-scheduling=${if asyncEffective == null then "auto" else onOff asyncEffective}"
    "device-resident=${onOff cfg.deviceResident}"
    "device-argmax=${onOff cfg.deviceArgmax}"
    "sdpa-streaming=${onOff cfg.sdpaStreaming}"
    "merge-batch-guard=${onOff cfg.mergeBatchGuard}"
    "tool-calling=${onOff tools.enable}"
    "tool-call-parser=${if tools.enable && tools.parser != null then tools.parser else "none"}"
    "hugepages=${if hugepages == null then "none" else "${toString hugepages.count}x${hugepages.size}"}"
    "digest=${digest}"
  ];

  checks = import ./checks.nix {
    inherit
      cfg
      opt
      defaults
      features
      mambaCacheModes
      hugepageSizesKiB
      ;
  };
in
{
  inherit
    args
    environment
    banner
    digest
    hugepages
    ;
  stopTimeout = cfg.stopTimeout;
  failedAssertions = typeErrors ++ checks.failedAssertions;
  inherit (checks) warnings;
}

# Assertions and warnings of services.tenstorrent-serving, builtins only (called by core.nix).
# Every message says what to change. The eval tier (tests/eval) checks each of them.
{
  cfg,
  opt,
  defaults,
  features,
  mambaCacheModes,
  hugepageSizesKiB,
}:
let
  check = condition: message: if condition then [ ] else [ message ];
  join = builtins.concatStringsSep ", ";

  # Flags the module manages: passing them through extraArgs would silently override an option
  # (vLLM keeps the last occurrence), so they are rejected with the option to use instead.
  managedFlags = {
    "--model" = "model";
    "--served-model-name" = "servedModelName";
    "--host" = "host";
    "--port" = "port";
    "--block-size" = "blockSize";
    "--max-model-len" = "maxModelLen";
    "--max-num-seqs" = "maxNumSeqs";
    "--enable-prefix-caching" = "enablePrefixCaching";
    "--no-enable-prefix-caching" = "enablePrefixCaching";
    "--mamba-cache-mode" = "mambaCacheMode";
    "--async-scheduling" = "asyncScheduling";
    "--no-async-scheduling" = "asyncScheduling";
    "--enable-auto-tool-choice" = "toolCalling.enable";
    "--tool-call-parser" = "toolCalling.parser";
  };
  flagOf = token: builtins.head (builtins.split "=" token);
  misusedFlags = builtins.filter (token: managedFlags ? ${flagOf token}) cfg.extraArgs;

  featureNames = builtins.attrValues cfg.environmentNames;
  misusedVariables = builtins.filter (name: builtins.elem name featureNames) (
    builtins.attrNames cfg.extraEnvironment
  );
  duplicateNames = builtins.attrNames (
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = true;
      }) (builtins.filter (name: builtins.length (builtins.filter (o: o == name) featureNames) > 1) featureNames)
    )
  );
  prefix = cfg.enablePrefixCaching;
in
{
  failedAssertions =
    check (cfg.deviceResident -> cfg.deviceArgmax)
      "${opt}.deviceResident requires deviceArgmax: the resident decode chain samples on the device. Set ${opt}.deviceArgmax = true, or deviceResident = false."
    ++
      check (prefix -> cfg.asyncScheduling != true)
        "${opt}.asyncScheduling = true conflicts with enablePrefixCaching: prefix sidecars require synchronous local execution. Set asyncScheduling = null (automatic: the module passes --no-async-scheduling) or false, or disable enablePrefixCaching."
    ++
      check (cfg.toolCalling.enable -> cfg.toolCalling.parser != null)
        "${opt}.toolCalling.enable needs a parser (vLLM's --enable-auto-tool-choice requires --tool-call-parser). Set ${opt}.toolCalling.parser, e.g. \"qwen3_coder\" for Qwen3.6."
    # vLLM (model_executor/models/config.py, HybridAttentionMambaModelConfig) keeps prefix
    # caching on with --mamba-cache-mode none and silently runs "align" (qwen36) or "all"
    # instead: the declared mode would not be the live one, so the module refuses it.
    ++
      check (!(prefix && cfg.mambaCacheMode == "none"))
        "${opt}.mambaCacheMode = \"none\" with enablePrefixCaching: vLLM keeps prefix caching on and switches the mode itself (to \"align\" for qwen36, with a warning), so the declared mode would not be the one that runs. Set ${opt}.mambaCacheMode = \"align\" (or \"all\" for a model that supports it), or enablePrefixCaching = false."
    ++
      check (builtins.elem cfg.mambaCacheMode mambaCacheModes)
        "${opt}.mambaCacheMode must be one of ${join mambaCacheModes}, got \"${cfg.mambaCacheMode}\"."
    ++
      check (hugepageSizesKiB ? ${cfg.hugepages.size})
        "${opt}.hugepages.size must be one of ${join (builtins.attrNames hugepageSizesKiB)}, got \"${cfg.hugepages.size}\"."
    ++
      check (cfg.hugepages.count >= 0)
        "${opt}.hugepages.count must be 0 (none) or a positive number of pages, got ${toString cfg.hugepages.count}."
    ++
      check (cfg.port > 0 && cfg.port < 65536)
        "${opt}.port must be between 1 and 65535, got ${toString cfg.port}."
    ++
      check (cfg.stopTimeout > 0)
        "${opt}.stopTimeout must be a positive number of seconds (docker stop -t), got ${toString cfg.stopTimeout}."
    ++
      check (cfg.devices != [ ])
        "${opt}.devices is empty: the container needs at least one Tenstorrent device, e.g. [ \"/dev/tenstorrent/0\" ]."
    ++
      check (misusedFlags == [ ])
        "${opt}.extraArgs must not contain flags the module manages (${join misusedFlags}): set ${
          join (map (token: "${opt}.${managedFlags.${flagOf token}}") misusedFlags)
        } instead."
    ++
      check (misusedVariables == [ ])
        "${opt}.extraEnvironment must not set the feature variables ${join misusedVariables}: use the feature options (${join (builtins.attrNames features.environment)}) instead."
    ++
      check (duplicateNames == [ ])
        "${opt}.environmentNames gives two features the same variable (${join duplicateNames}); each feature needs its own name.";

  warnings =
    check (prefix || cfg.mambaCacheMode == defaults.mambaCacheMode)
      "${opt}.mambaCacheMode = \"${cfg.mambaCacheMode}\" has no effect while enablePrefixCaching is false."
    ++
      check (!(prefix && cfg.deviceResident))
        "${opt}.deviceResident with prefix caching: resident decode's async-decode benefit is disabled under prefix caching. Keep it only after the interleaved conc-8 A/B (both arms with prefix caching) shows a gain beyond the ~0.5 % noise band."
    ++
      check (!(prefix && cfg.deviceArgmax))
        "${opt}.deviceArgmax with prefix caching failed 1 of 32 concurrent requests once; certify it with at least 8 x 32 = 256 concurrent requests without a failure before relying on it.";
}

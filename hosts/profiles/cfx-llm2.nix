# Serving profile: production on cfx-llm2 (serve issue #52, issue #49, the owner's advisory).
# A plain attrset of services.tenstorrent-serving option values; hosts and the VM test hosts
# import it unchanged. The expectations it must meet are vmtests/profiles/cfx-llm2.yaml.
{
  # Option B of #52: prefix caching with the validated mamba cache mode. asyncScheduling stays
  # null (automatic), so the module passes --no-async-scheduling: prefix sidecars require
  # synchronous local execution.
  enablePrefixCaching = true;
  mambaCacheMode = "align";

  # The merge batch guard (#45, proven free) and SDPA streaming: /run-only before (#49).
  mergeBatchGuard = true;
  sdpaStreaming = true;

  # Production tool calling (#49): Qwen3.6 uses the qwen3_coder parser.
  toolCalling = {
    enable = true;
    parser = "qwen3_coder";
  };

  # The hugepage reduction (#49), reserved at boot by a sysinit-ordered oneshot. Upstream
  # tt-system-tools reserves 4 x 1 GiB per card; production ran with fewer to keep MemAvailable
  # at or above ~4 GB for the verification boot (advisory). The exact production count lived
  # only under /run and is not in the seed: 2 x 1 GiB is our choice, and this is the one line to
  # change (with vmtests/profiles/*.yaml) once the operators confirm it.
  hugepages = {
    count = 2;
    size = "1G";
  };

  # Device-resident decode is deliberately NOT here: see ./resident.nix for why.
}

# Defaults of every services.tenstorrent-serving option: the one place. core.nix fills missing
# values from here, and the module's option declarations use these as their `default`s.
# builtins only: plain nix-instantiate must be able to evaluate this file.
let
  features = builtins.fromJSON (builtins.readFile ./features.json);
in
{
  enable = false;
  # The serving image; production hosts pin their own tag, the VM tests load the stub image.
  image = "tenstorrent/vllm-qwen36:latest";
  imageFile = null;
  model = "/models/qwen36";
  servedModelName = "qwen36";
  host = "0.0.0.0";
  port = 8000;
  # The NixOS firewall is on by default (nixos/modules/services/networking/firewall.nix).
  openFirewall = false;
  devices = [ "/dev/tenstorrent/0" ];
  # qwen36 runs with 64-token blocks on the TT plugin.
  blockSize = 64;
  maxModelLen = null;
  maxNumSeqs = null;

  enablePrefixCaching = false;
  mambaCacheMode = "align";
  # null = automatic: --no-async-scheduling whenever prefix caching is on, else vLLM decides.
  asyncScheduling = null;

  # The qwen36 feature switches; their environment names come from features.json.
  deviceResident = false;
  deviceArgmax = false;
  sdpaStreaming = false;
  mergeBatchGuard = false;
  environmentNames = builtins.mapAttrs (_: feature: feature.name) features.environment;

  toolCalling = {
    enable = false;
    parser = "qwen3_coder";
  };

  # count = 0 reserves nothing.
  hugepages = {
    count = 0;
    size = "1G";
  };

  extraArgs = [ ];
  extraEnvironment = { };
  extraOptions = [ ];

  # Seconds of the graceful stop: `docker stop -t 60`, never `docker rm -f` (advisory).
  stopTimeout = 60;
}

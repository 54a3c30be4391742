#!/bin/sh
# Test fixture: ExecStart script of tenstorrent-serving.service in nixosConfigurations.cfx-llm2
# as the full NixOS evaluation renders it (nixpkgs nixos/modules/virtualisation/oci-containers.nix
# mkService's script, written by nixos/lib/systemd-lib.nix makeJobScript), produced with
#   python3 -c 'from vmtests.nixos_eval import serving_unit;
#     print(serving_unit("cfx-llm2").exec_start.file_text(), end="")'
# and these comment lines added; the interpreter line is file_text's stand-in for runtimeShell.
# tests/eval/test_eval_start_script.py checks that it still equals the evaluation.
set -e

exec docker  \
  run \
  --name=tenstorrent-serving \
  --log-driver=journald \
  -e QWEN36_MERGE_BATCH_GUARD=1 \
  -e QWEN36_SDPA_STREAMING=1 \
  --rm \
  --pull missing \
  '--device=/dev/tenstorrent/0' \
  '--volume=/dev/hugepages-1G:/dev/hugepages-1G' \
  '--ipc=host' \
  '--network=host' \
  '--stop-timeout=60' \
  '--volume=/var/lib/models:/models:ro' \
  tenstorrent/vllm-qwen36:latest \
  --model \
  /models/qwen36 \
  --served-model-name \
  qwen36 \
  --host \
  0.0.0.0 \
  --port \
  8000 \
  --block-size \
  64 \
  --enable-prefix-caching \
  --mamba-cache-mode \
  align \
  --no-async-scheduling \
  --enable-auto-tool-choice \
  --tool-call-parser \
  qwen3_coder


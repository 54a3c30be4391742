"""The engine's own statement of its config: the engine config line and ``cache_config_info``.

Both are what the real server says about the configuration it *runs*, after every startup
decision, so the scenario checks them instead of trusting argv or banners:

- vLLM ``v1/engine/core.py`` logs ``Initializing a V1 LLM engine (v<version>) with config:
  model=..., ..., served_model_name=..., enable_prefix_caching=..., ...`` (the ``VllmConfig``
  ``__str__`` of ``config/vllm.py``; a subset of its fields here, in upstream order);
- vLLM ``v1/metrics/loggers.py`` (``PrometheusStatLogger.log_metrics_info``) publishes
  ``vllm:cache_config_info``, a gauge set to 1 whose labels are ``CacheConfig.metrics_info()``
  (``config/cache.py``: every field as ``str(value)``, in field order) plus ``engine``.
"""

from __future__ import annotations

from vmtests.stub.args import ServeArgs
from vmtests.stub.prefix_cache import DEFAULT_CAPACITY_BLOCKS
from vmtests.stub.release import VLLM_VERSION
from vmtests.stub.startup import Plan


def cache_config(args: ServeArgs, plan: Plan) -> dict[str, str]:
    """``CacheConfig.metrics_info()`` of the running engine (field order of config/cache.py)."""
    prefix = plan.prefix_caching
    block_size = args.effective_block_size
    # A hybrid model aligns mamba blocks to the KV block size under prefix caching, else
    # uses max_model_len (model_executor/models/config.py).
    mamba_block_size = block_size if prefix else args.effective_max_model_len
    values: dict[str, object] = {
        "block_size": block_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "swap_space": 4,
        "cache_dtype": "auto",
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": prefix,
        "prefix_caching_hash_algo": "sha256",
        "cpu_offload_gb": 0,
        "calculate_kv_scales": False,
        "kv_sharing_fast_prefill": False,
        "mamba_page_size_padded": None,
        "mamba_block_size": mamba_block_size,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": plan.mamba_cache_mode,
        "kv_offloading_size": None,
        "kv_offloading_backend": None,
        "num_gpu_blocks": DEFAULT_CAPACITY_BLOCKS,
        "num_cpu_blocks": 0,
    }
    return {key: str(value) for key, value in values.items()}


def engine_config_line(args: ServeArgs, plan: Plan) -> str:
    """The ``Initializing a V1 LLM engine ... with config: ...`` line of the engine core."""
    model = args.model_path
    fields = [
        f"model={model!r}",
        "speculative_config=None",
        f"tokenizer={model!r}",
        "skip_tokenizer_init=False",
        "tokenizer_mode=auto",
        "revision=None",
        "tokenizer_revision=None",
        f"trust_remote_code={args.trust_remote_code}",
        "dtype=torch.bfloat16",
        f"max_seq_len={args.effective_max_model_len}",
        "download_dir=None",
        "load_format=auto",
        f"tensor_parallel_size={args.tensor_parallel_size}",
        "pipeline_parallel_size=1",
        "data_parallel_size=1",
        "disable_custom_all_reduce=False",
        "quantization=None",
        "enforce_eager=False",
        "kv_cache_dtype=auto",
        "device_config=cpu",
        f"seed={args.seed if args.seed is not None else 0}",
        f"served_model_name={args.model_name}",
        f"enable_prefix_caching={plan.prefix_caching}",
        "enable_chunked_prefill=True",
        "pooler_config=None",
    ]
    return f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: {', '.join(fields)}"

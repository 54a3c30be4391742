"""A real block-hash prefix cache, as vLLM's KV cache manager keeps it.

The prompt's token ids are cut into full blocks of ``block_size`` tokens. Block ``i`` is keyed by
a hash chained over block ``i - 1``'s key and block ``i``'s tokens, so a key names the whole
prefix up to it. A lookup counts the leading blocks already cached; like vLLM it never counts
the prompt's last token as a hit (one token must be computed to sample from). Queries and hits
are counted in tokens, as ``vllm:prefix_cache_queries_total`` / ``hits_total`` are.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CAPACITY_BLOCKS = 8192


@dataclass(frozen=True)
class Lookup:
    """The outcome of one prefix-cache lookup, in tokens."""

    queried: int
    hit: int


class PrefixCache:
    """Chained block hashes with LRU eviction; thread-safe."""

    def __init__(self, block_size: int, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def block_keys(self, token_ids: Sequence[int]) -> list[bytes]:
        """The chained keys of every full block of ``token_ids``."""
        keys: list[bytes] = []
        parent = b""
        full = len(token_ids) - len(token_ids) % self.block_size
        for start in range(0, full, self.block_size):
            block = token_ids[start : start + self.block_size]
            digest = hashlib.sha256(parent)
            digest.update(b",".join(str(token).encode() for token in block))
            parent = digest.digest()
            keys.append(parent)
        return keys

    def lookup_and_insert(self, token_ids: Sequence[int]) -> Lookup:
        """Count the cached prefix of ``token_ids``, then cache all of its full blocks."""
        keys = self.block_keys(token_ids)
        # The last prompt token is always computed, so at most (n - 1) // block_size blocks hit.
        hittable = (len(token_ids) - 1) // self.block_size if token_ids else 0
        with self._lock:
            hit_blocks = 0
            for key in keys[:hittable]:
                if key not in self._blocks:
                    break
                hit_blocks += 1
            for key in keys:
                self._blocks[key] = None
                self._blocks.move_to_end(key)
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)
        return Lookup(queried=len(token_ids), hit=hit_blocks * self.block_size)

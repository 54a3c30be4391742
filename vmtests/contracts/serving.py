"""The serving unit as every tier sees it: its name, its port, its device, its hugepages and
its readiness budget.

The NixOS module sets the oci-containers ``serviceName`` so that the unit has the same name on
a NixOS host, in the NixOS test VM and on the reference guest
(``modules/tenstorrent-serving.nix``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SERVING_UNIT = "tenstorrent-serving.service"
"""The systemd unit that runs the serving container (or the stub server)."""

HUGEPAGES_UNIT = "tenstorrent-hugepages.service"
"""The boot-time oneshot that reserves the card's hugepages."""

SERVING_CONTAINER = SERVING_UNIT.removesuffix(".service")
"""The serving container's name: the module's container ``name`` (its ``serviceName`` is the
unit). Every tier runs the server in it; the checks read its argv and environment from
``docker inspect``."""

SERVING_PORT = 8000
"""The port the OpenAI-compatible server listens on (vLLM's default, the module's default)."""

READY_TIMEOUT = 300.0
"""Seconds the server may take to answer ``/health`` after a start, a switch or a reboot.

Generous because a guest under TCG on two shared cores starts the stub several times slower
than a host does; a real model load on a P150 is bounded by the same figure.
"""

DEVICE = "/dev/tenstorrent/0"
"""The card's device node: the module's default ``devices``, what the stub device layer creates
and the stub server requires (tt-kmd names the first card so)."""

GIB_KIB = 1024 * 1024
"""KiB in a GiB: a 1G hugepage, and the unit of the certification's memory floor."""

HUGEPAGE_SIZES_KIB = {"1G": GIB_KIB, "2M": 2048}
"""The module's ``hugepages.size`` values and their page sizes, as in
``/sys/kernel/mm/hugepages/hugepages-<KiB>kB``."""

HUGEPAGE_POOLS = "/sys/kernel/mm/hugepages"
"""Where the kernel shows each hugepage pool: ``hugepages-<KiB>kB/nr_hugepages``."""

POOL_SIZES = (
    f"for d in {HUGEPAGE_POOLS}/hugepages-*kB; do "
    '[ -r "$d/nr_hugepages" ] && echo "${d##*hugepages-} $(cat "$d/nr_hugepages")"; done'
)
"""Shell printing ``<KiB>kB <pages>`` for every hugepage pool (``parse_pools`` reads it)."""


def hugepages_path(size_kib: int) -> str:
    """The sysfs file holding the pool size of ``size_kib`` KiB pages."""
    return f"{HUGEPAGE_POOLS}/hugepages-{size_kib}kB/nr_hugepages"


def parse_pools(text: str) -> dict[int, int]:
    """``POOL_SIZES``'s ``<size>kB <nr_hugepages>`` lines as ``{size KiB: pages}``."""
    pools: dict[int, int] = {}
    for line in text.splitlines():
        size, _, count = line.partition(" ")
        size = size.removesuffix("kB")
        if size.isdigit() and count.strip().isdigit():
            pools[int(size)] = int(count.strip())
    return pools


@dataclass(frozen=True)
class Hugepages:
    """``count`` hugepages of ``size`` ("1G" or "2M") reserved at boot: what the Nix core
    computes for a serving profile and what an expectation profile requires."""

    count: int
    size: str

    def __post_init__(self) -> None:
        if self.size not in HUGEPAGE_SIZES_KIB:
            raise ValueError(
                f"hugepage size {self.size!r}: expected one of {list(HUGEPAGE_SIZES_KIB)}"
            )

    @property
    def size_kib(self) -> int:
        """The page size in KiB, as in ``/sys/kernel/mm/hugepages/hugepages-<KiB>kB``."""
        return HUGEPAGE_SIZES_KIB[self.size]

    @property
    def mount_point(self) -> str:
        """The hugetlbfs mount the module declares and passes to the container."""
        return f"/dev/hugepages-{self.size}"

    def __str__(self) -> str:
        return f"{self.count} x {self.size}"

    @classmethod
    def from_core(cls, data: Mapping[str, object] | None) -> Hugepages | None:
        """The core's ``hugepages`` (``null`` or ``{ count; size; sizeKiB; }``), checked."""
        if data is None:
            return None
        pages = cls(int(str(data["count"])), str(data["size"]))
        if int(str(data["sizeKiB"])) != pages.size_kib:
            raise ValueError(f"the Nix core's hugepages {dict(data)} disagree on the page size")
        return pages


API_KEY_VARIABLE = "VLLM_API_KEY"
"""The variable vLLM reads its API key from when no ``--api-key`` is given (vLLM ``envs.py``);
tt-inference-server's entrypoint sets it, or derives it from ``JWT_SECRET``
(tt-inference-server ``vllm-tt-metal/src/run_vllm_api_server.py``, ``handle_secrets``)."""

API_KEY_GUARDED_PREFIX = "/v1"
"""With a key, vLLM answers 401 ``{"error": "Unauthorized"}`` to every path under ``/v1`` that
lacks ``Authorization: Bearer <key>``; ``/health``, ``/metrics`` and ``/version`` stay open
(vLLM 0.16 ``entrypoints/openai/server_utils.py``, ``AuthenticationMiddleware``). A probe of
``/health`` therefore cannot tell whether a key is needed: ``/v1/models`` can."""

MIN_MEM_AVAILABLE_GIB = 4.0
"""The owner's advisory on serve #52: before the verification boot, ``MemAvailable`` must be at
least about 4 GB (docs/requirements.md). The run's preflight and the certification hold it."""

MIN_DISK_GIB = 1.0
"""Free space on ``/`` a switch needs at least (a new generation's store paths and logs): the
run's preflight and the certification's hold it."""

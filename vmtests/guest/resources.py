"""Does a profile's hugepage reservation fit in a test guest's memory?

Every test guest, the NixOS VM and the reference guest alike, gets the contract's memory and
vCPUs (``GUEST_MEMORY_MB``, ``GUEST_CPUS`` in ``vmtests/contracts/instrumentation.json``). A
1 GiB page needs a free, 1 GiB-aligned GiB of physical memory, and on QEMU's ``pc`` machine
the RAM below 4 GiB never offers one reliably: the kernel sits in the first GiB, the PCI hole
takes the fourth, and the third ends a few KiB short of its boundary. Early allocations sit at
the top of memory, and the system, dockerd and the server need room besides the pages. The
measurements behind the rule are in docs/ci-time.md.
"""

from __future__ import annotations

from vmtests.contracts.instrumentation import (
    GUEST_MEMORY_MB,
    HUGEPAGE_HEADROOM_MB,
    HUGEPAGE_LOW_MEMORY_MB,
)
from vmtests.contracts.serving import GIB_KIB, Hugepages

# The rule's two numbers are contract fields, so that hosts/vm-test/common.nix applies the same
# rule to the NixOS VM: HUGEPAGE_LOW_MEMORY_MB is the RAM below 4 GiB that never yields an
# aligned 1 GiB page (``pc`` machine layout); HUGEPAGE_HEADROOM_MB is what the guest needs
# besides the pages: kernel, systemd, dockerd, the server, and the GiB at the top of memory that
# early allocations occupy.


def required_memory_mb(count: int, size_kib: int) -> int:
    """The guest memory (MB) that reserves ``count`` pages of ``size_kib`` KiB reliably."""
    if count <= 0:
        return HUGEPAGE_HEADROOM_MB
    pages_mb = count * size_kib // 1024
    low = HUGEPAGE_LOW_MEMORY_MB if size_kib >= GIB_KIB else 0
    return low + pages_mb + HUGEPAGE_HEADROOM_MB


def check_hugepages_fit(hugepages: Hugepages, memory_mb: int = GUEST_MEMORY_MB) -> None:
    """Raise ``ValueError`` saying what to change when the pages do not fit in ``memory_mb``."""
    needed = required_memory_mb(hugepages.count, hugepages.size_kib)
    if memory_mb < needed:
        raise ValueError(
            f"{hugepages} hugepages need {needed} MB of guest memory to be reserved "
            f"reliably, but the guest has {memory_mb} MB: raise resources.memoryMB in "
            "vmtests/contracts/instrumentation.json or reserve fewer pages"
        )

"""The serving unit as every tier sees it: its name, its port and its readiness budget.

The NixOS module sets the oci-containers ``serviceName`` so that the unit has the same name on
a NixOS host, in the NixOS test VM and on the reference guest
(``modules/tenstorrent-serving.nix``).
"""

from __future__ import annotations

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

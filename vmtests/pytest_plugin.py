"""The vmtests pytest plugin: markers, command-line options and fixtures."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's markers."""
    config.addinivalue_line("markers", "vm: boots a QEMU guest (needs qemu-system-x86_64)")
    config.addinivalue_line("markers", "nix: evaluates Nix (needs nix-instantiate)")
    config.addinivalue_line("markers", "hw: runs on a real P150 host (explicit opt-in only)")

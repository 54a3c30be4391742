"""Fixtures of the certification's VM tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from certify_vm_support import serving_guest

from vmtests.driver.qemu import QemuMachine


@pytest.fixture
def guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QemuMachine]:
    """A reference guest serving cfx-llm2 (stub) for one test, restored from the snapshot cache:
    the tests share no guest, so they run on whichever worker is free."""
    name = request.node.originalname.removeprefix("test_").replace("_", "-")[:40]
    yield from serving_guest(tmp_path_factory, name)

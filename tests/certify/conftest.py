"""Fixtures of the certification's VM tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from certify_vm_support import serving_guest

from vmtests.driver.qemu import QemuMachine
from vmtests.guest.image import ReferenceImage


@pytest.fixture(scope="module")
def guest(
    request: pytest.FixtureRequest,
    reference_image: ReferenceImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[QemuMachine]:
    """One reference guest serving cfx-llm2 (stub) per test module, shared by its tests."""
    name = request.module.__name__.removeprefix("test_").removesuffix("_vm").replace("_", "-")
    yield from serving_guest(reference_image, tmp_path_factory, name)

"""Fixtures of the certification's VM tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from certify_vm_support import ServingGuest, serving_guests


@pytest.fixture
def serving_guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServingGuest]:
    """``serving_guest(**knobs)``: a reference guest serving cfx-llm2 (stub) with the stub knobs
    ``knobs`` set, for one test, restored from the snapshot cache: the tests share no guest, so
    they run on whichever worker is free."""
    name = request.node.originalname.removeprefix("test_").replace("_", "-")[:40]
    yield from serving_guests(tmp_path_factory, name)

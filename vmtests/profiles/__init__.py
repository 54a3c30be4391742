"""Expectation profiles: hand-written YAML saying what each serving profile must produce.

``load_profile("cfx-llm2")`` loads ``vmtests/profiles/cfx-llm2.yaml``; the comparison of an argv,
an environment, a module banner and hugepages against a profile lives in
``vmtests.profiles.expectations``.
"""

from __future__ import annotations

from vmtests.profiles.loader import available_profiles, load_profile
from vmtests.profiles.schema import (
    ArgExpectation,
    BannerExpectation,
    Profile,
    ProfileError,
)

__all__ = [
    "ArgExpectation",
    "BannerExpectation",
    "Profile",
    "ProfileError",
    "available_profiles",
    "load_profile",
]

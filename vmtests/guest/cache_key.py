"""The content-addressed part of the suite's cache, named without building: ``vmtests cache-key``.

The reference guest image and the stub image are each built into ``<kind>/<digest>/``, where the
digest covers every input of the build (``vmtests.guest.build_cache``, ``image.input_hash``,
``stub_image.input_hash``). A CI cache keyed on that digest therefore restores exactly the
build the suite would otherwise make, and a change to any input misses it. The rest of the
cache directory (the ssh key, the KVM verdict, the eval tier's nixpkgs) is not content
addressed and is not named here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmtests.guest import image, stub_image
from vmtests.guest.build_cache import is_complete


@dataclass(frozen=True)
class CachedBuild:
    """One content-addressed build: its name for CI, its input digest and its directory."""

    name: str
    digest: str
    directory: Path

    @property
    def built(self) -> bool:
        """Whether the build is complete in the cache (restored, or built by a run)."""
        return is_complete(self.directory)


def cached_builds() -> tuple[CachedBuild, ...]:
    """The builds a run of the suite uses, named by the digests the suite itself computes.

    Reading the guest's digest needs the suite's ssh key (its public key is an input of the
    image): one is generated if there is none, as a run would.
    """
    guest_digest = image.input_hash(image.public_key_of(image.suite_ssh_key()))
    stub_digest = stub_image.input_hash()
    return (
        CachedBuild("guest-image", guest_digest, image.image_builds() / guest_digest),
        CachedBuild("stub-image", stub_digest, stub_image.stub_image_builds() / stub_digest),
    )


def output_lines(builds: tuple[CachedBuild, ...]) -> Iterator[str]:
    """``name=value`` lines, as GitHub-style ``$GITHUB_OUTPUT`` files take them: per build its
    digest, its directory and whether it is built."""
    for build in builds:
        yield f"{build.name}={build.digest}"
        yield f"{build.name}-path={build.directory}"
        yield f"{build.name}-built={'true' if build.built else 'false'}"

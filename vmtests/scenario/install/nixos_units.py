"""The serving units of the full NixOS evaluation, mapped onto the reference guest.

``vmtests.nixos_eval`` evaluates a VM configuration of this flake (``vm-test-<profile>``) with
nixpkgs and gives the text of every unit the serving module renders (the container service,
the hugepage oneshot, the hugetlbfs mount) and of every job script they run. The reference
guest installs exactly those texts, with each store path replaced by its counterpart on the
guest:

- a job script ``/nix/store/<hash>-unit-script-<name>`` becomes a file of the same name under
  ``STORE_DIR`` (written there, executable), its text the file ``makeJobScript`` writes;
- a package of the tool manifest (docker, coreutils, systemd, ...) that has a Debian stand-in
  becomes its directory under ``vmtests.guest.toolpath.PACKAGES_DIR`` (the manifest says which
  attribute a store path is);
- the image file (``docker load -i``) becomes the stub image's file on the guest;
- exactly two paths of ``systemd.globalEnvironment`` become Debian's: the locale archive
  (``glibc-locales``) and the zoneinfo tree (``tzdata``).

A store path that none of these explains is refused with its name (``UnmappedStorePath``):
the guest would run something the suite never provided. So is what the mapping cannot carry:
strict-shell-check job scripts (``writeShellApplication``), unit links that the unit file's
text does not show (``requiredBy``, ``upheldBy``, ``aliases``, a disabled unit) and drop-ins.

``differences`` compares two renderings exactly, store hashes aside; the reference guest
refuses to run when ``vmtests.scenario.install.serving_unit`` (the renderer the negative
controls vary) no longer renders what NixOS does.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests import nixos_eval
from vmtests.contracts.instrumentation import GUEST_TOOLS
from vmtests.guest import toolpath
from vmtests.scenario.install.serving_unit import STORE_DIR, RenderedUnits, job_script_text

NIX_STORE_PATH = re.compile(
    r"(/nix/store/[0-9a-z]{32}-[0-9a-zA-Z+._?=-]+)((?:/[0-9a-zA-Z+._?=@-]+)*)"
)
"""A store path: its root ``/nix/store/<hash>-<name>`` (the characters Nix allows in a store
name, Nix ``src/libstore/path.cc``) and the path inside it."""

GUEST_STORE_PATH = re.compile(re.escape(STORE_DIR) + r"/[0-9a-z]{32}-")
"""A store file's hash on the reference guest (both renderers name files like this)."""

FHS_FILES = {
    ("glibc-locales-", "/lib/locale/locale-archive"): "/usr/lib/locale/locale-archive",
    ("tzdata-", "/share/zoneinfo"): "/usr/share/zoneinfo",
}
"""(store name prefix, path inside it) -> the same file or tree on Debian."""

UNIT_KEYS = {"serving": "tenstorrent-serving.service", "hugepages": "tenstorrent-hugepages.service"}
"""The services of ``tests/eval/nixos-eval.nix``'s ``units`` the guest installs, by file name."""

BASE_CONFIGURATION = "vm-test-base"
BASE_SERVING_PROFILE = "hosts/profiles/baseline.nix"
PRODUCTION_CONFIGURATION = "cfx-llm2"
"""The flake's production host (``flake.nix``, ``hosts/cfx-llm2``): what a real host runs."""


class UnmappedStorePath(ValueError):
    """A rendered unit names something the reference guest has no counterpart for."""


def configuration_for(serving_profile: str) -> str:
    """The flake's VM configuration that serves ``serving_profile`` (``flake.nix``: the base VM
    serves the baseline; ``vm-test-<name>`` serves ``hosts/profiles/<name>.nix``)."""
    if serving_profile == BASE_SERVING_PROFILE:
        return BASE_CONFIGURATION
    path = Path(serving_profile)
    if path.parent != Path("hosts/profiles") or path.suffix != ".nix":
        raise ValueError(f"{serving_profile} is not a serving profile under hosts/profiles/")
    return f"vm-test-{path.stem}"


@dataclass(frozen=True)
class StoreMap:
    """Store path roots of one configuration and where each one is on the reference guest."""

    roots: Mapping[str, str]

    def apply(self, text: str, where: str) -> str:
        """``text`` with every store path mapped; ``UnmappedStorePath`` names those that are not."""
        unknown: list[str] = []

        def replace(match: re.Match[str]) -> str:
            root, inside = match.group(1), match.group(2)
            if root in self.roots:
                return self.roots[root] + inside
            name = root.split("-", 1)[1]
            for (prefix, path), target in FHS_FILES.items():
                if name.startswith(prefix) and inside == path:
                    return target
            unknown.append(match.group(0))
            return match.group(0)

        mapped = NIX_STORE_PATH.sub(replace, text)
        if unknown:
            raise UnmappedStorePath(
                f"{where} names store paths the reference guest has no counterpart for: "
                f"{sorted(set(unknown))} (vmtests.scenario.install.nixos_units maps job scripts, "
                "the tool manifest's packages with a Debian stand-in, the image file, the locale "
                "archive and the zoneinfo tree)"
            )
        return mapped


def store_map(description: Mapping[str, Any], image_file: str | None) -> StoreMap:
    """The roots of ``description`` (one configuration of ``nixos_eval``) on the guest."""
    roots: dict[str, str] = {}
    for key in UNIT_KEYS:
        unit = description["units"].get(key)
        for script in (unit or {}).get("scripts", {}):
            found = NIX_STORE_PATH.fullmatch(script)
            if found is None:
                raise UnmappedStorePath(f"job script {script} is not a store path")
            roots[found.group(1)] = f"{STORE_DIR}/{found.group(1).rsplit('/', 1)[1]}"
    for program, package in description["toolPackages"].items():
        attribute = GUEST_TOOLS[program]
        # Only packages the guest has a directory for (tt-smi and nix have none: refused).
        if attribute in toolpath.DEBIAN_PACKAGES:
            roots[package] = f"{toolpath.PACKAGES_DIR}/{attribute}"
    image_path = description.get("imageFilePath")
    if image_path is not None:
        if image_file is None:
            raise UnmappedStorePath(
                f"the configuration loads the image file {image_path}; no file on the guest"
            )
        roots[image_path] = image_file
    return StoreMap(roots)


def rendered_units(configuration: str, image_file: str | None) -> RenderedUnits:
    """The units and job scripts ``configuration`` renders, mapped onto the reference guest.

    Raises ``nixos_eval.NixosEvalUnavailable`` where no evaluation can run, and
    ``UnmappedStorePath`` for anything the mapping cannot carry over.
    """
    description = nixos_eval.describe(configuration)
    mapping = store_map(description, image_file)
    rendered = RenderedUnits()
    for key, name in UNIT_KEYS.items():
        unit = description["units"].get(key)
        if unit is None:
            continue
        where = f"{configuration}: {name}"
        if unit["strict"]:
            raise UnmappedStorePath(
                f"{where} has enableStrictShellChecks: its job scripts are writeShellApplication "
                "scripts, which this mapping does not render"
            )
        if unit["links"]:
            raise UnmappedStorePath(
                f"{where} has links its unit file does not show ({unit['links']}); "
                "installing the file alone would lose them"
            )
        if not unit["enable"]:
            raise UnmappedStorePath(
                f"{where} has enable = False: NixOS links it to /dev/null, which installing "
                "the file alone would lose"
            )
        if unit["overrideStrategy"] != "asDropinIfExists":
            raise UnmappedStorePath(
                f"{where} is a drop-in (overrideStrategy = {unit['overrideStrategy']}), "
                "not a unit file"
            )
        rendered.units[name] = mapping.apply(unit["text"], where)
        for path, body in unit["scripts"].items():
            guest_path = mapping.apply(path, where)
            rendered.scripts[guest_path] = job_script_text(mapping.apply(body, f"{where} {path}"))
    for name, text in description.get("mounts", {}).items():
        rendered.units[name] = mapping.apply(text, f"{configuration}: {name}")
    return rendered


def normalized(rendered: RenderedUnits) -> dict[str, str]:
    """Every file of ``rendered`` by name, exactly, with the store hashes taken out."""

    def clean(text: str) -> str:
        return GUEST_STORE_PATH.sub(STORE_DIR + "/", text)

    files = {f"unit {name}": clean(text) for name, text in rendered.units.items()}
    files |= {f"script {clean(path)}": clean(text) for path, text in rendered.scripts.items()}
    return files


def differences(ours: RenderedUnits, nixos: RenderedUnits) -> list[str]:
    """Unified diffs (``ours`` against ``nixos``) of every file that differs; [] when equal."""
    mine, theirs = normalized(ours), normalized(nixos)
    found: list[str] = []
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) == theirs.get(name):
            continue
        diff = difflib.unified_diff(
            (mine.get(name) or "(absent)\n").splitlines(keepends=True),
            (theirs.get(name) or "(absent)\n").splitlines(keepends=True),
            f"vmtests: {name}\n",
            f"NixOS: {name}\n",
        )
        found.append("".join(diff))
    return found

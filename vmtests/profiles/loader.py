"""Load and validate expectation profiles (``vmtests/profiles/<name>.yaml``)."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from vmtests.contracts.paths import REPO_ROOT
from vmtests.contracts.serving import HUGEPAGE_SIZES_KIB, Hugepages
from vmtests.profiles.schema import (
    EXPECTATION_KEYS,
    TOP_LEVEL_KEYS,
    ArgExpectation,
    BannerExpectation,
    Profile,
    ProfileError,
    SchemaReader,
    UniqueKeyLoader,
)

PROFILES_DIR = Path(__file__).resolve().parent
# Installed without the repository (the flake's app), hosts/ and modules/ are not beside us.
_IN_CHECKOUT = (REPO_ROOT / "modules" / "serving" / "features.json").is_file()


def available_profiles() -> list[str]:
    """Names of the profiles shipped in ``vmtests/profiles/`` (sorted)."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load one profile: a bare name loads ``vmtests/profiles/<name>.yaml``, else a file path."""
    text = str(name_or_path)
    is_bare_name = (
        isinstance(name_or_path, str) and "/" not in text and not text.endswith((".yaml", ".yml"))
    )
    source = PROFILES_DIR / f"{text}.yaml" if is_bare_name else Path(name_or_path)
    if not source.is_file():
        known = ", ".join(available_profiles()) or "none"
        raise ProfileError(f"{source}: no such profile file (available profiles: {known})")
    try:
        document = yaml.load(source.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise ProfileError(f"{source}: not valid YAML: {error}") from error
    return parse_profile(document, source)


def parse_profile(document: object, source: Path) -> Profile:
    """Validate a parsed YAML document against the schema and build the ``Profile``."""
    reader = SchemaReader(source)
    if document is None or document == {}:
        reader.error(
            "<top level>", "a profile mapping with expectations (the file is empty)", show_got=False
        )
    top = reader.mapping(document, "", TOP_LEVEL_KEYS)
    if not any(top.get(key) for key in EXPECTATION_KEYS):
        reader.error(
            "<top level>",
            f"at least one non-empty expectation section of {', '.join(EXPECTATION_KEYS)}",
            show_got=False,
        )
    name = reader.string(top.get("name", source.stem), "name")
    if name != source.stem:
        reader.error("name", f"the file's stem {source.stem!r}", name)
    args_present, args_absent = _args(reader, top.get("args", {}))
    env_set, env_absent = _environment(reader, top.get("environment", {}))
    banners_present, banners_absent = _banners(reader, top.get("banners", {}))
    module_banner = reader.string_map(top.get("module_banner", {}), "module_banner")
    return Profile(
        name=name,
        description=reader.string(top.get("description"), "description"),
        serving_profile=_serving_profile(reader, top.get("serving_profile")),
        args_present=args_present,
        args_absent=args_absent,
        env_set=MappingProxyType(env_set),
        env_absent=env_absent,
        banners_present=banners_present,
        banners_absent=banners_absent,
        module_banner=MappingProxyType(dict(module_banner)),
        hugepages=_hugepages(reader, top.get("hugepages")),
        source=source,
        server_config=MappingProxyType(
            dict(reader.string_map(top.get("server_config", {}), "server_config"))
        ),
    )


def _serving_profile(reader: SchemaReader, value: object) -> str:
    path = reader.string(value, "serving_profile")
    if path.startswith("/") or not path.endswith(".nix"):
        reader.error("serving_profile", "a .nix file relative to the repository root", path)
    if _IN_CHECKOUT and not (REPO_ROOT / path).is_file():
        reader.error("serving_profile", f"an existing file under {REPO_ROOT}", path)
    return path


def _flag(reader: SchemaReader, value: object, path: str) -> str:
    flag = reader.string(value, path)
    if not flag.startswith("-") or " " in flag or "=" in flag:
        reader.error(path, "a single command-line flag such as --enable-prefix-caching", flag)
    return flag


def _args(
    reader: SchemaReader, value: object
) -> tuple[tuple[ArgExpectation, ...], tuple[str, ...]]:
    section = reader.mapping(value, "args", frozenset({"present", "absent"}))
    present: list[ArgExpectation] = []
    raw_present = section.get("present", [])
    if not isinstance(raw_present, list):
        reader.error("args.present", "a list of flags or {flag, value} mappings", raw_present)
    for index, item in enumerate(raw_present):
        path = f"args.present[{index}]"
        if isinstance(item, dict):
            entry = reader.mapping(item, path, frozenset({"flag", "value"}))
            flag = _flag(reader, entry.get("flag"), f"{path}.flag")
            raw_value = entry.get("value")
            arg_value = None if raw_value is None else reader.string(raw_value, f"{path}.value")
            present.append(ArgExpectation(flag, arg_value))
        else:
            present.append(ArgExpectation(_flag(reader, item, path)))
    reader.no_duplicates([arg.flag for arg in present], "args.present")
    absent = reader.string_list(section.get("absent", []), "args.absent")
    for index, flag in enumerate(absent):
        _flag(reader, flag, f"args.absent[{index}]")
        if any(arg.flag == flag for arg in present):
            reader.error(
                f"args.absent[{index}]", f"a flag not also in args.present ({flag})", show_got=False
            )
    return tuple(present), tuple(absent)


def _environment(reader: SchemaReader, value: object) -> tuple[dict[str, str], tuple[str, ...]]:
    allowed = frozenset({"set", "set_features", "absent", "absent_features"})
    section = reader.mapping(value, "environment", allowed)
    env_set = dict(reader.string_map(section.get("set", {}), "environment.set"))
    by_feature = reader.string_map(section.get("set_features", {}), "environment.set_features")
    for feature, env_value in by_feature.items():
        name = reader.feature(feature, f"environment.set_features.{feature}")
        if name in env_set:
            reader.error(
                f"environment.set_features.{feature}", f"{name} set only once", show_got=False
            )
        env_set[name] = env_value
    absent = reader.string_list(section.get("absent", []), "environment.absent")
    features = reader.string_list(section.get("absent_features", []), "environment.absent_features")
    absent += [
        reader.feature(feature, f"environment.absent_features[{index}]")
        for index, feature in enumerate(features)
    ]
    reader.no_duplicates(absent, "environment.absent (+ absent_features)")
    for name in absent:
        if name in env_set:
            reader.error("environment.absent", f"{name} not both set and absent", show_got=False)
    return env_set, tuple(absent)


def _banner_list(reader: SchemaReader, value: object, path: str) -> list[BannerExpectation]:
    if not isinstance(value, list):
        reader.error(path, "a list of {name, pattern} mappings", value)
    banners: list[BannerExpectation] = []
    for index, item in enumerate(value):
        entry = reader.mapping(item, f"{path}[{index}]", frozenset({"name", "pattern"}))
        name = reader.string(entry.get("name"), f"{path}[{index}].name")
        pattern = reader.string(entry.get("pattern"), f"{path}[{index}].pattern")
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            reader.error(
                f"{path}[{index}].pattern", f"a valid regular expression ({error})", pattern
            )
        banners.append(BannerExpectation(name, compiled))
    return banners


def _banners(
    reader: SchemaReader, value: object
) -> tuple[tuple[BannerExpectation, ...], tuple[BannerExpectation, ...]]:
    section = reader.mapping(value, "banners", frozenset({"present", "absent"}))
    present = _banner_list(reader, section.get("present", []), "banners.present")
    absent = _banner_list(reader, section.get("absent", []), "banners.absent")
    reader.no_duplicates([banner.name for banner in present + absent], "banners (names)")
    return tuple(present), tuple(absent)


def _hugepages(reader: SchemaReader, value: object) -> Hugepages | None:
    if value is None:
        return None
    section: dict[str, Any] = reader.mapping(value, "hugepages", frozenset({"count", "size"}))
    count = section.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        reader.error("hugepages.count", "a positive integer", count)
    size = section.get("size")
    if size not in HUGEPAGE_SIZES_KIB:
        reader.error("hugepages.size", f"one of {', '.join(HUGEPAGE_SIZES_KIB)}", size)
    return Hugepages(count, str(size))

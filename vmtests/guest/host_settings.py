"""Per-host settings: every timeout, the SSH options, the API key file, the container and the port.

They are the settings declared ``per_host`` in ``vmtests.contracts.settings`` (where each one's
default, variable and meaning are written once). The defaults suit the reference guest; a real
P150 host needs others (docs/first-run.md says which and why), set for that host in two places,
as testinfra's host specs take options:

- in a small YAML file kept next to the host's configuration (``--host-config FILE``), one
  ``name: value`` per line;
- as query options of the target: ``ssh://root@cfx-llm2?ready_timeout=3600&identity_file=/k``.

They are layered with ``Settings.overridden`` over the environment's (``VMTESTS_*``): the
target's options win over the file, the file over the environment, the environment over the
default; ``Settings.origin`` says where each value came from, and every report shows it
(``Settings.describe``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import yaml

from vmtests.contracts.settings import (
    REAL_HOST_DEFAULTS,
    REAL_HOST_ORIGIN,
    SettingError,
    Settings,
    settings,
)
from vmtests.guest import SSH_TARGET_PREFIX

SSH_SETTINGS = (
    "connect_timeout",
    "identity_file",
    "known_hosts",
    "strict_host_key_checking",
    "sudo",
)
"""The settings that go to ``SshMachine`` (``vmtests.driver.ssh``), under the same names; an
ssh target's only."""
TARGET_OPTION = "target option"


def split_target(target: str) -> tuple[str, dict[str, str]]:
    """``ssh://root@host?ready_timeout=3600`` -> (``ssh://root@host``, its options)."""
    base, question, query = target.partition("?")
    if not question:
        return target, {}
    options: dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name in options:
            raise SettingError(f"target option {name} is given twice in {target!r}")
        options[name] = value
    return base, options


def _text(value: object) -> str:
    """A YAML value as the text a setting parses (``true`` for YAML's True)."""
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_host_config(path: Path) -> dict[str, str]:
    """The settings of a ``--host-config`` YAML file: name -> text."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise SettingError(f"--host-config {path}: {error}") from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise SettingError(f"--host-config {path}: expected a mapping of settings")
    return {str(name): _text(value) for name, value in document.items()}


def _per_host(values: Mapping[str, str], origin: str) -> Mapping[str, str]:
    """``values``, refused when one of them is not a per-host setting."""
    allowed = Settings.per_host()
    strays = sorted(set(values) - set(allowed))
    if strays:
        raise SettingError(
            f"{origin}: unknown setting {', '.join(map(repr, strays))} (a host's settings: "
            f"{', '.join(allowed)})"
        )
    return values


def resolve(
    target: str, host_config: Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, Settings]:
    """The target without its options, and its settings: the environment's, then the host's
    YAML file, then the target's options; on an ssh:// target, the timeouts none of them set
    take a real host's defaults (``REAL_HOST_DEFAULTS``), not the reference guest's. SSH
    settings on a target that is not ssh:// are refused; so is any setting that is not a
    host's."""
    base, options = split_target(target)
    found = settings(environ)
    if host_config is not None:
        origin = f"--host-config {host_config}"
        found = found.overridden(_per_host(load_host_config(host_config), origin), origin)
    found = found.overridden(_per_host(options, TARGET_OPTION), TARGET_OPTION)
    if base.startswith(SSH_TARGET_PREFIX):
        found = found.defaulted(REAL_HOST_DEFAULTS, REAL_HOST_ORIGIN)
    else:
        given = [
            name
            for name in SSH_SETTINGS
            if found.origin(name) in {TARGET_OPTION, f"--host-config {host_config}"}
        ]
        if given:
            raise SettingError(f"{', '.join(given)}: ssh:// targets only, not {base}")
    return base, found


def ssh_options(found: Settings) -> dict[str, object]:
    """The options of ``SshMachine`` these settings give."""
    return {name: getattr(found, name) for name in SSH_SETTINGS}


def machine_options(target: str, found: Settings) -> dict[str, object]:
    """The options of the machine ``target`` (without its query options) names that these
    settings give: the ssh ones on an ssh:// target, none on another."""
    return ssh_options(found) if target.startswith(SSH_TARGET_PREFIX) else {}

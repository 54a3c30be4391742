"""Every setting the suite reads from its environment, in one typed place.

Each field of ``Settings`` is declared once with ``setting(...)``: the variable it is read from
(``VMTESTS_*``), its default and the values it accepts; its docstring says what it means.
README's table of environment variables lists every variable the code reads, with its default
and meaning (``tests/test_settings.py`` holds the table to the code, and fails when the code
reads a variable the table lacks). Nothing else in the package reads these
variables: call ``settings()``, which reads the environment at each call, so that a variable set
for a while (a test, ``vmtests bench``) takes effect.

Values from elsewhere are layered over the environment's through the same declarations:
``Settings.overridden(values, origin)`` parses and checks ``field name -> text`` pairs (a host
file, a target's options) exactly as the environment's, and names ``origin`` in its errors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The keys of a setting's field metadata.
VARIABLE, SHOWN_DEFAULT, CHOICES, PARSE = ("variable", "shown", "choices", "parse")


ACCELERATORS = ("auto", "kvm", "tcg")
"""The values of the ``accel`` setting (QEMU's accelerator, or ``auto``)."""
REBOOT_MODES = ("restart", "reset")
"""The values of the ``reboot_mode`` setting."""


def _text(value: str) -> str:
    return value


def _path(value: str) -> Path | None:
    return Path(value).expanduser() if value else None


def setting(
    variable: str,
    default: object,
    *,
    choices: tuple[str, ...] = (),
    parse: Callable[[str], object] = _text,
    shown: str | None = None,
) -> Any:
    """A ``Settings`` field read from ``variable``: ``default`` when it is unset or empty (shown
    in README as ``shown``), one of ``choices`` when there are any, converted by ``parse``."""
    metadata = {
        VARIABLE: variable,
        SHOWN_DEFAULT: shown if shown is not None else f"`{default}`",
        CHOICES: choices,
        PARSE: parse,
    }
    return field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A setting holds a value the suite cannot use; the message names where it came from."""


@dataclass(frozen=True)
class Settings:
    """The suite's settings (see the module docstring); ``settings()`` reads them."""

    accel: str = setting("VMTESTS_ACCEL", "auto", choices=ACCELERATORS)
    """QEMU's accelerator: ``auto`` probes KVM once per host, kernel and QEMU, remembers the
    verdict for a day (``<cache>/kvm-verdict.json``) and falls back to TCG."""

    reboot_mode: str = setting("VMTESTS_REBOOT_MODE", "restart", choices=REBOOT_MODES)
    """How a QEMU guest reboots: ``restart`` (the guest shuts down, QEMU exits under
    ``-no-reboot`` and a fresh QEMU boots the same disk) or ``reset`` (QEMU resets it in place)."""

    qemu: str = setting("VMTESTS_QEMU", "qemu-system-x86_64")
    """The QEMU system emulator the driver runs."""

    cache_dir: Path | None = setting(
        "VMTESTS_CACHE_DIR",
        None,
        parse=_path,
        shown="`$XDG_CACHE_HOME/vmtests`, else `~/.cache/vmtests`",
    )
    """Where the suite keeps what it builds or learns once per machine: guest and stub images,
    the ssh key, the NixOS eval tier's nixpkgs tree, chroot and evaluations, the KVM verdict."""

    nixpkgs: Path | None = setting(
        "VMTESTS_NIXPKGS",
        None,
        parse=_path,
        shown="the tree `scripts/setup-nixos-eval` extracted into the cache, if any",
    )
    """A nixpkgs tree for the full NixOS evaluation (used as it is, never cached on disk)."""

    nixpkgs_lib: Path | None = setting(
        "NIXPKGS_LIB",
        None,
        parse=_path,
        shown="the cache's `nixpkgs-lib`, then the NixOS eval tier's tree, then `<nixpkgs/lib>`",
    )
    """A nixpkgs ``lib`` for the module tier."""

    debian_mirror: str = setting("VMTESTS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    """The Debian mirror the reference guest and the stub image are built from."""

    units: str = setting("VMTESTS_UNITS", "auto", choices=("auto", "nixos", "renderer"))
    """Which units the reference guest installs: ``nixos`` (the full NixOS evaluation's; an
    error where none can run), ``renderer`` (rendered from the Nix core) or ``auto`` (``nixos``
    where a nixpkgs tree is set up, else ``renderer``); every report says which ran and why."""

    @classmethod
    def fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """The declared settings, in order."""
        return dataclasses.fields(cls)

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable that field ``name`` is read from."""
        return str(next(f for f in cls.fields() if f.name == name).metadata[VARIABLE])

    def overridden(self, values: Mapping[str, str], origin: str) -> Settings:
        """These settings with ``values`` (field name -> text) parsed and checked over them; an
        empty text keeps the current value. ``SettingError`` names ``origin`` and the field."""
        known = {f.name: f for f in self.fields()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise SettingError(f"{origin}: unknown settings {unknown}; known: {sorted(known)}")
        changes: dict[str, Any] = {}
        for name, text in values.items():
            if not text:
                continue
            declared = known[name]
            choices = declared.metadata[CHOICES]
            value = text.strip().lower() if choices else text
            if choices and value not in choices:
                variable = declared.metadata[VARIABLE]
                raise SettingError(
                    f"{origin}: {name} (${variable}) is {text!r}: expected one of "
                    f"{', '.join(choices)}"
                )
            changes[name] = declared.metadata[PARSE](value)
        return dataclasses.replace(self, **changes)


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings as ``environ`` (the process environment by default) gives them."""
    environ = os.environ if environ is None else environ
    variables = {f.name: environ.get(f.metadata[VARIABLE], "") for f in Settings.fields()}
    return Settings().overridden(variables, "the environment")

"""Checks of the full NixOS evaluation tier, as functions that return what is wrong, so that the
negative tests can show each one catching its fault."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qs

from vmtests.contracts.serving import HUGEPAGE_SIZES_KIB
from vmtests.guest.resources import required_memory_mb

# oci-containers.nix's docker run options that take no value, and the image position: the
# container's own argv (the vLLM command line) is everything after the image.
VM_TARGETS = {"vm-test-cfx-llm2": "cfx-llm2", "vm-test-resident": "resident"}
VM_CONFIGURATIONS = ("vm-test-base", *VM_TARGETS)
ALL_CONFIGURATIONS = ("cfx-llm2", *VM_CONFIGURATIONS)


def missing_tools(path: Sequence[str], tool_packages: Mapping[str, str]) -> list[str]:
    """Manifest programs whose package has neither ``bin`` nor ``sbin`` on ``path``."""
    entries = set(path)
    return sorted(
        program
        for program, package in tool_packages.items()
        if f"{package}/bin" not in entries and f"{package}/sbin" not in entries
    )


FORCED_REMOVAL = re.compile(r"\b(docker|podman)\s+(container\s+)?rm\b[^\n]*\s(-f|--force)\b")


def forced_removals(scripts: Mapping[str, str | None]) -> list[str]:
    """``name: line`` of every forced removal (``docker rm -f``) in the given scripts, and of
    every script whose text is unknown (it cannot be shown not to remove forcibly)."""
    found: list[str] = []
    for name, text in scripts.items():
        if text is None:
            found.append(f"{name}: not a job script of the unit, its text is unknown")
            continue
        found += [
            f"{name}: {line.strip()}" for line in text.splitlines() if FORCED_REMOVAL.search(line)
        ]
    return found


def graceful_before_removal(text: str, name: str, stop_timeout: int) -> bool:
    """Whether ``text`` stops container ``name`` with the grace period before removing it."""
    stop = text.find(f"docker stop -t {stop_timeout} {name}")
    remove = text.find(f"docker rm {name}")
    return stop != -1 and remove != -1 and stop < remove


def hugepages_fit(memory_mb: int, count: int, size: str) -> bool:
    """Whether ``count`` pages of ``size`` fit the guest's memory by the contract's rule."""
    # vmtests.guest.resources' rule, which hosts/vm-test/common.nix asserts with the same numbers.
    return required_memory_mb(count, HUGEPAGE_SIZES_KIB[size]) <= memory_mb


def container_argv(docker_run: Sequence[str], image: str) -> list[str]:
    """The container's own argv: what follows the image in a ``docker run`` argv."""
    return list(docker_run[list(docker_run).index(image) + 1 :])


def container_environment(docker_run: Sequence[str], image: str) -> dict[str, str]:
    """``-e K=V`` options before the image."""
    options = list(docker_run[: list(docker_run).index(image)])
    environment: dict[str, str] = {}
    for flag, value in itertools.pairwise(options):
        if flag == "-e":
            key, _, text = value.partition("=")
            environment[key] = text
    return environment


def switch_command_lines(script: str) -> dict[str, str]:
    """The shell command of each switch (``rebuild``, ``prebuilt``) of a persistence script's
    ``case``."""
    found: dict[str, str] = {}
    for line in script.splitlines():
        match = re.match(r"\s*(\w+)\) switch=(.*) ;;$", line)
        if match:
            (found[match.group(1)],) = shlex.split(match.group(2))
    return found


def switch_commands(script: str) -> dict[str, list[str]]:
    """The words of each switch (``rebuild``, ``prebuilt``) of a persistence script's ``case``."""
    return {name: shlex.split(line) for name, line in switch_command_lines(script).items()}


def python_name(requirement: str) -> str:
    """The PEP 503 normalised name of a PEP 508 requirement (``qemu.qmp>=0.0.3`` -> ``qemu-qmp``),
    as nixpkgs' python-runtime-deps-check-hook.py normalises it, and as nixpkgs spells pnames."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def missing_python_packages(requirements: Sequence[str], pnames: Sequence[str]) -> list[str]:
    """The requirements (normalised names) that no package of ``pnames`` provides."""
    provided = {python_name(pname) for pname in pnames}
    return sorted({python_name(r) for r in requirements} - provided)


def firewall_problems(described: Mapping[str, object]) -> list[str]:
    """Why clients outside the machine (the VM tests' forwarded port among them) could not reach
    the serving port through the NixOS firewall (nixos/modules/services/networking/firewall.nix:
    on by default, dropping what no allowed port or trusted interface admits)."""
    serving = described.get("serving")
    firewall = described.get("firewall")
    if not isinstance(serving, Mapping) or not isinstance(firewall, Mapping):
        return []
    port = serving.get("port")
    allowed = list(firewall.get("allowedTCPPorts") or [])
    if firewall.get("enable") and port not in allowed:
        return [f"the firewall is on and admits TCP ports {allowed}, not the serving port {port}"]
    return []


def exports_before(script: str, marker: str) -> dict[str, str]:
    """``export NAME=value`` lines of a build script before the first line containing
    ``marker`` (the command they are meant for)."""
    exported: dict[str, str] = {}
    for line in script.splitlines():
        if marker in line:
            return exported
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                exported[name] = value
    raise ValueError(f"no line of the script contains {marker!r}")


GITHUB_FLAKE_REF = re.compile(
    r"^github:(?P<owner>[^/?]+)/(?P<repo>[^/?]+)(?:/(?P<ref>[^?]+))?(?:\?(?P<query>.*))?$"
)


def github_branch(url: str) -> tuple[str, str, str | None] | None:
    """(owner, repo, ref) of a ``github:owner/repo[/ref][?ref=...]`` flake URL, else None."""
    found = GITHUB_FLAKE_REF.match(url)
    if found is None:
        return None
    ref = found.group("ref") or parse_qs(found.group("query") or "").get("ref", [None])[0]
    return found.group("owner"), found.group("repo"), ref


def release_branch(release: str) -> str:
    """NixOS's branch of a release: ``nixos-26.11`` (nixpkgs
    nixos/doc/manual/installation/upgrading.chapter.md: the channels ``nixos-<release>``;
    nixos/modules/installer/tools/tools.nix: "change the word unstable to the latest number")."""
    return f"nixos-{release}"


def nixpkgs_input_problems(
    url: str, evaluated_release: str, locked: Mapping[str, object] | None
) -> list[str]:
    """Why the nixpkgs that ``nix flake check`` would test is not the one this tier evaluated:
    the flake's input must follow ``nixos-<release>`` of the evaluated tree, on NixOS/nixpkgs,
    and a committed flake.lock must be locked from that same input."""
    wanted = release_branch(evaluated_release)
    parsed = github_branch(url)
    if parsed is None:
        return [f"flake.nix's nixpkgs input {url!r} is not a github: URL; follow {wanted}"]
    problems: list[str] = []
    owner, repo, ref = parsed
    if (owner.lower(), repo.lower()) != ("nixos", "nixpkgs"):
        problems.append(f"flake.nix's nixpkgs input {url!r} is not github:NixOS/nixpkgs")
    if ref != wanted:
        problems.append(
            f"flake.nix's nixpkgs input follows {ref or 'the default branch'}, but the evaluated "
            f"nixpkgs is release {evaluated_release}: follow {wanted} (and re-lock), or evaluate "
            f"a {ref or 'matching'} tree (scripts/setup-nixos-eval)"
        )
    if locked is not None:
        lock = (str(locked.get("owner", "")), str(locked.get("repo", "")), locked.get("ref"))
        if locked.get("type") != "github" or lock != parsed:
            problems.append(
                f"flake.lock locks nixpkgs from {dict(locked)}, not from {url!r}: run "
                "`nix flake lock` and commit flake.lock"
            )
    return problems

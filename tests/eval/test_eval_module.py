"""(d) The real module evaluated with lib.evalModules and a nixpkgs lib (skipped without one).

module-eval.nix declares the NixOS options the module sets and models what nixpkgs'
oci-containers defines for the unit, so these tests see the module's overrides win.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from eval_support import configuration_mismatches, evaluate_module, explain, profile_values

from vmtests.contracts.paths import REPO_ROOT
from vmtests.contracts.serving import HUGEPAGE_SIZES_KIB, Hugepages
from vmtests.nixcore import evaluate_core
from vmtests.profiles import available_profiles, load_profile

pytestmark = pytest.mark.nix


@pytest.mark.parametrize("name", available_profiles())
def test_module_container_meets_the_profile(nixpkgs_lib: Path, name: str) -> None:
    profile = load_profile(name)
    result = evaluate_module(nixpkgs_lib, profile_values(profile))
    assert result["failedAssertions"] == [], result["failedAssertions"]
    container, serving = result["container"], result["serving"]
    mismatches = configuration_mismatches(
        profile,
        container["cmd"],
        container["environment"],
        serving["preStart"].splitlines()[0],
        _hugepages_from_units(result),
    )
    assert not mismatches, f"profile {name}: the module breaks the expectations:\n" + explain(
        mismatches
    )
    # The module adds no flag logic: its container runs exactly what the core computed.
    core = evaluate_core(profile_file=Path(profile.serving_profile))
    assert container["cmd"] == core.args
    assert container["environment"] == core.environment
    assert core.banner in serving["preStart"]


def test_the_production_host_runs_the_cfx_llm2_profile(nixpkgs_lib: Path) -> None:
    profile = load_profile("cfx-llm2")
    result = evaluate_module(nixpkgs_lib, host=Path("hosts/cfx-llm2"))
    assert result["failedAssertions"] == [], result["failedAssertions"]
    container = result["container"]
    mismatches = configuration_mismatches(
        profile,
        container["cmd"],
        container["environment"],
        result["serving"]["preStart"].splitlines()[0],
        _hugepages_from_units(result),
    )
    assert not mismatches, "hosts/cfx-llm2 breaks profile cfx-llm2:\n" + explain(mismatches)
    assert "--volume=/var/lib/models:/models:ro" in container["extraOptions"]


def _hugepages_from_units(result: dict[str, Any]) -> Hugepages | None:
    """Read count and page size back from the generated oneshot's script."""
    unit = result["hugepages"]
    if unit is None:
        return None
    pool = re.search(r"hugepages-(\d+)kB", unit["script"])
    count = re.search(
        r"^\s*(?:if ! )?echo (\d+) > \"\$pool/nr_hugepages\"(?:; then)?$", unit["script"], re.M
    )
    assert pool, f"no hugepage pool path in the oneshot script:\n{unit['script']}"
    assert count, f"no nr_hugepages write in the oneshot script:\n{unit['script']}"
    size = {kib: name for name, kib in HUGEPAGE_SIZES_KIB.items()}[int(pool.group(1))]
    return Hugepages(int(count.group(1)), size)


def test_the_unit_is_tenstorrent_serving_with_the_device_layer(nixpkgs_lib: Path) -> None:
    result = evaluate_module(nixpkgs_lib, "import ./hosts/profiles/cfx-llm2.nix")
    container = result["container"]
    assert container["serviceName"] == "tenstorrent-serving"
    assert "tenstorrent-serving" in result["services"]
    assert result["backend"] == "docker"
    assert container["log-driver"] == "journald"
    for option in (
        "--device=/dev/tenstorrent/0",
        "--volume=/dev/hugepages-1G:/dev/hugepages-1G",
        "--ipc=host",
    ):
        assert option in container["extraOptions"], container["extraOptions"]


def test_the_stop_is_graceful_for_60_seconds(nixpkgs_lib: Path) -> None:
    serving = evaluate_module(nixpkgs_lib, "import ./hosts/profiles/cfx-llm2.nix")["serving"]
    assert serving["preStop"].strip().splitlines() == [
        "docker stop -t 60 tenstorrent-serving || exit 0",
        # systemd SIGTERMs what still runs when ExecStop ends: let `docker run` exit first.
        'while kill -0 "${MAINPID:-}" 2>/dev/null; do sleep 0.2; done',
    ]
    assert "rm -f" not in serving["postStop"], serving["postStop"]
    # The leftover-container cleanup stops gracefully before removing.
    post = serving["postStop"]
    assert post.index("docker stop -t 60") < post.index("docker rm tenstorrent-serving")
    assert serving["serviceConfig"]["TimeoutStopSec"] > 60
    assert "RuntimeDirectoryPreserve" not in serving["serviceConfig"]  # podman only


def test_the_podman_backend_also_stops_gracefully(nixpkgs_lib: Path) -> None:
    result = evaluate_module(nixpkgs_lib, "import ./hosts/profiles/cfx-llm2.nix", backend="podman")
    serving = result["serving"]
    assert result["backend"] == "podman"
    assert "podman stop --ignore -t 60" in serving["preStop"]
    # A failed stop hands over to systemd's SIGTERM at once instead of failing the stop.
    assert "--cidfile=/run/tenstorrent-serving/ctr-id || exit 0" in serving["preStop"]
    assert "rm -f" not in serving["postStop"]
    # oci-containers' RuntimeDirectory for podman holds the image load stamp: kept until reboot.
    assert serving["serviceConfig"]["RuntimeDirectoryPreserve"] == "yes"


def test_a_longer_stop_timeout_moves_the_systemd_timeout(nixpkgs_lib: Path) -> None:
    values = "import ./hosts/profiles/cfx-llm2.nix // { stopTimeout = 300; }"
    serving = evaluate_module(nixpkgs_lib, values)["serving"]
    assert "docker stop -t 300" in serving["preStop"]
    assert serving["serviceConfig"]["TimeoutStopSec"] > 300


def test_hugepages_are_reserved_at_boot_in_sysinit(nixpkgs_lib: Path) -> None:
    result = evaluate_module(nixpkgs_lib, "import ./hosts/profiles/cfx-llm2.nix")
    unit = result["hugepages"]
    assert unit["wantedBy"] == ["sysinit.target"]
    assert "sysinit.target" in unit["before"]
    assert unit["unitConfig"]["DefaultDependencies"] is False
    assert unit["serviceConfig"]["Type"] == "oneshot"
    assert "/sys/kernel/mm/hugepages/hugepages-1048576kB" in unit["script"]
    (mount,) = result["mounts"]
    assert (mount["where"], mount["type"], mount["options"]) == (
        "/dev/hugepages-1G",
        "hugetlbfs",
        "pagesize=1G",
    )
    assert "tenstorrent-hugepages.service" in result["serving"]["requires"]


def test_no_hugepage_units_without_hugepages(nixpkgs_lib: Path) -> None:
    result = evaluate_module(nixpkgs_lib, "import ./hosts/profiles/baseline.nix")
    assert result["hugepages"] is None
    assert result["mounts"] == []
    assert not any("hugepages" in option for option in result["container"]["extraOptions"])


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ("{ deviceResident = true; }", "deviceResident requires deviceArgmax"),
        (
            "{ enablePrefixCaching = true; asyncScheduling = true; }",
            "prefix sidecars require synchronous local execution",
        ),
        ("{ toolCalling = { enable = true; parser = null; }; }", "needs a parser"),
    ],
    ids=["resident-without-argmax", "prefix-with-async", "tools-without-parser"],
)
def test_module_assertions_come_from_the_core(
    nixpkgs_lib: Path, values: str, fragment: str
) -> None:
    (message,) = evaluate_module(nixpkgs_lib, values)["failedAssertions"]
    assert fragment in message


def test_the_option_table_documents_every_option(nixpkgs_lib: Path) -> None:
    names = evaluate_module(nixpkgs_lib, "{ }")["optionNames"]
    table = (REPO_ROOT / "README.md").read_text()
    missing = [name for name in names if f"`{name}" not in table]
    assert not missing, f"README.md lacks the options {missing}"


def test_open_firewall_opens_exactly_the_serving_port(nixpkgs_lib: Path) -> None:
    assert evaluate_module(nixpkgs_lib, "{ }")["firewallPorts"] == []
    opened = evaluate_module(nixpkgs_lib, "{ openFirewall = true; port = 8123; }")
    assert opened["firewallPorts"] == [8123]

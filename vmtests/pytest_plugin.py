"""The vmtests pytest plugin: markers, command-line options and fixtures.

With ``--vmtests-keep``, a machine fixture (``vmtests_machine``, ``shared_reference_guest``,
``reference_guest``) whose test failed hands its QEMU guest to the keeper instead of closing it
(``vmtests.driver.keep_run.keep_machine``), as ``vmtests run --keep`` does; the lines that say how
to attach and how to stop it go to the test's report and to the end of the session's summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from vmtests.guest import REFERENCE_TARGET, SSH_TARGET_PREFIX, TARGET_FORMS

if TYPE_CHECKING:
    from vmtests.contracts.settings import Settings
    from vmtests.driver.machine import Machine
    from vmtests.driver.qemu import QemuMachine
    from vmtests.guest.image import ReferenceImage
    from vmtests.profiles import Profile


def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's markers."""
    config.addinivalue_line("markers", "vm: boots a QEMU guest (needs qemu-system-x86_64)")
    config.addinivalue_line("markers", "nix: evaluates Nix (needs nix-instantiate)")
    config.addinivalue_line("markers", "hw: runs on a real P150 host (explicit opt-in only)")
    config.addinivalue_line(
        "markers",
        "nightly: a long VM test of the nightly tier, which pre-merge CI leaves out; runs "
        "with --nightly (README, Test tiers)",
    )
    # pytest-xdist's marker, registered here too so that --strict-markers accepts it without
    # xdist (tests then simply run in one process).
    config.addinivalue_line("markers", "xdist_group(name): run on the same xdist worker")
    config.addinivalue_line(
        "markers",
        "guest_seconds(n): the guest work of this module's xdist group, in seconds on the CI "
        "machine (docs/ci-time.md); the heaviest groups are handed out first",
    )
    if config.getoption("--vmtests-keep", False):
        from vmtests.driver import keep  # noqa: PLC0415

        # Every QEMU of the session starts under a keeper, so that a failed test's can stay.
        keeping = contextlib.ExitStack()
        keeping.enter_context(keep.keeping(True))
        config.stash[_KEEPING] = keeping


def pytest_unconfigure(config: pytest.Config) -> None:
    """End ``--vmtests-keep``'s keeping."""
    keeping = config.stash.get(_KEEPING, None)
    if keeping is not None:
        keeping.close()


# ---- options, profile and machine target (the persistence scenario) ------------------------------
# Options: --profile, --target, --host-config, --report-dir, --nightly, --hw-opt-in. Tests
# marked ``hw`` run only with an ``ssh://`` target AND --hw-opt-in; everything else ignores the
# hardware entirely. Tests marked ``nightly`` run only with --nightly.
# The host's settings come from the target's query options and --host-config as ``vmtests run``
# takes them (``vmtests.guest.host_settings.resolve``).

DEFAULT_PROFILE = "cfx-llm2"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The suite's command-line options."""
    group = parser.getgroup("vmtests", "vmtests persistence scenario")
    group.addoption(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"expectation profile name or YAML path (default {DEFAULT_PROFILE})",
    )
    group.addoption(
        "--target",
        default=REFERENCE_TARGET,
        help=f"machine target: {TARGET_FORMS} (default {REFERENCE_TARGET})",
    )
    group.addoption(
        "--host-config",
        default=None,
        metavar="FILE",
        help="YAML file of the target host's settings (timeouts, ssh options, ...), as "
        "`vmtests run --host-config` takes it",
    )
    group.addoption(
        "--report-dir",
        default=None,
        help="directory for reports (JSON, JUnit XML, Markdown, console logs); default: tmp",
    )
    group.addoption(
        "--nightly",
        action="store_true",
        default=False,
        help="also run the nightly tier: the long VM tests (marked nightly) that pre-merge "
        "CI leaves out",
    )
    group.addoption(
        "--hw-opt-in",
        action="store_true",
        default=False,
        help="allow tests marked hw to run against the --target ssh:// host (reboots it!)",
    )
    group.addoption(
        "--vmtests-keep",
        action="store_true",
        default=False,
        help="when a test using a machine fixture fails, leave its QEMU guest running and say "
        "how to attach to it and how to stop it (as vmtests run --keep)",
    )
    group.addoption(
        "--vmtests-keep-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a kept guest powers itself off after this long (default: vmtests run's --keep-for)",
    )


def hardware_allowed(config: pytest.Config) -> bool:
    """True only with an explicit --hw-opt-in and an ssh:// --target."""
    target = str(config.getoption("--target"))
    return bool(config.getoption("--hw-opt-in")) and target.startswith(SSH_TARGET_PREFIX)


NIGHTLY_SKIP_REASON = (
    "nightly tier: a long VM test that pre-merge CI leaves out; run it with --nightly"
)

SHARED_GUEST_GROUP = "shared-reference-guest"
SHARED_GUEST_SECONDS = 175.0
"""The shared guest's ``guest_seconds``: its tests live in several modules, so no module marker
states it (the figure is measured in CI, docs/ci-time.md); unweighted, it would wait among the
light tests."""


# tryfirst: pytest-xdist's loadgroup reads the xdist_group markers in this same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``hw`` tests unless the hardware tier was explicitly opted into, and ``nightly``
    tests without ``--nightly``; keep the tests
    of the shared reference guest, and those of each VM module, on one xdist worker, so that
    each guest boots once."""
    skip = pytest.mark.skip(
        reason="hardware tier: needs --target ssh://user@host AND --hw-opt-in (explicit opt-in)"
    )
    skip_nightly = pytest.mark.skip(reason=NIGHTLY_SKIP_REASON)
    for item in items:
        if "hw" in item.keywords and not hardware_allowed(config):
            item.add_marker(skip)
        if item.get_closest_marker("nightly") and not config.getoption("--nightly"):
            item.add_marker(skip_nightly)
        if "shared_reference_guest" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SHARED_GUEST_GROUP))
        elif "vm" in item.keywords and _uses_a_module_fixture(item):
            # Such a module's tests stay on one worker: its module-scoped guest boots once.
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items[:] = heaviest_groups_first(items)


def heaviest_groups_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the weighted xdist groups first (``guest_seconds``): those of a single
    test, then the others, each heaviest first; the rest in collection order.

    pytest-xdist's ``loadgroup`` hands each idle worker the next group in this order (with
    ``--no-loadscope-reorder``, which pyproject.toml sets; its default orders by test count).
    A long group that starts last ends last: started first, the longest guests overlap the
    rest of the run. Single-test groups go before all others because of how xdist hands out
    work (``xdist/scheduler/loadscope.py``, ``_reschedule``): a worker gets the next group
    whenever two or fewer of its tests are pending, and holds its last test until it knows the
    next one, so a group of one test always brings the next group onto its worker at once.
    At the start both workers take two groups anyway; later, consecutive single-test groups
    pile up on one worker while the other runs dry (seen in CI, docs/ci-time.md).
    """
    weights: dict[str, float] = {SHARED_GUEST_GROUP: SHARED_GUEST_SECONDS}
    sizes: dict[str, int] = {}
    for item in items:
        group = _xdist_group(item)
        sizes[group] = sizes.get(group, 0) + 1
        marker = item.get_closest_marker("guest_seconds")
        if marker is not None:
            weights[group] = max(weights.get(group, 0.0), float(marker.args[0]))

    def place(item: pytest.Item) -> tuple[bool, float]:
        group = _xdist_group(item)
        weight = weights.get(group, 0.0)
        return (not (weight and sizes[group] == 1), -weight)

    return sorted(items, key=place)


def _xdist_group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else item.nodeid


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """True when one of the fixtures ``item`` uses is module-scoped."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(definition.scope == "module" for defs in definitions.values() for definition in defs)


@pytest.fixture(scope="session")
def vmtests_profile(pytestconfig: pytest.Config) -> Profile:
    """The expectation profile named by --profile."""
    from vmtests.profiles import ProfileError, load_profile  # noqa: PLC0415

    try:
        return load_profile(str(pytestconfig.getoption("--profile")))
    except ProfileError as error:
        raise pytest.UsageError(f"--profile: {error}") from error


@pytest.fixture(scope="session")
def vmtests_target(pytestconfig: pytest.Config) -> str:
    """The machine target string given by --target (with its query options, as reports show
    it)."""
    return str(pytestconfig.getoption("--target"))


@pytest.fixture(scope="session")
def vmtests_resolved_target(
    pytestconfig: pytest.Config, vmtests_target: str
) -> tuple[str, Settings]:
    """--target without its query options, and the host's settings: the environment's, then
    --host-config, then the target's options; on an ssh:// target the timeouts none of them set
    are a real host's (``vmtests.guest.host_settings.resolve``, as ``vmtests run`` does)."""
    from vmtests.contracts.settings import SettingError  # noqa: PLC0415
    from vmtests.guest.host_settings import resolve  # noqa: PLC0415

    host_config = pytestconfig.getoption("--host-config")
    try:
        return resolve(vmtests_target, Path(str(host_config)) if host_config else None)
    except SettingError as error:
        raise pytest.UsageError(str(error)) from error


@pytest.fixture(scope="session")
def vmtests_settings(vmtests_resolved_target: tuple[str, Settings]) -> Settings:
    """The target host's settings (timeouts, ssh options, container, port, API key file), for
    whatever a test runs against ``vmtests_machine``."""
    return vmtests_resolved_target[1]


@pytest.fixture(scope="session")
def vmtests_report_dir(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Where reports go: --report-dir, else a session temporary directory."""
    option = pytestconfig.getoption("--report-dir")
    directory = Path(str(option)) if option else tmp_path_factory.mktemp("vmtests-reports")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def vmtests_machine(
    request: pytest.FixtureRequest,
    pytestconfig: pytest.Config,
    vmtests_resolved_target: tuple[str, Settings],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Machine]:
    """The machine --target names, with the host's ssh settings (``vmtests_settings``), not
    started (the scenario starts it); closed at the end.

    An ssh:// target is refused without --hw-opt-in: the scenario reboots the machine.
    """
    from vmtests.guest.host_settings import machine_options  # noqa: PLC0415
    from vmtests.guest.targets import machine_from_target  # noqa: PLC0415

    target, found = vmtests_resolved_target
    if target.startswith(SSH_TARGET_PREFIX) and not hardware_allowed(pytestconfig):
        pytest.skip(f"--target {target} is a real host: pass --hw-opt-in to use it")
    options = machine_options(target, found)
    state_dir = tmp_path_factory.mktemp("machine")
    machine = machine_from_target(target, state_dir, **options)
    try:
        yield machine
    finally:
        close_or_keep(request, machine, state_dir, target)


# ---- VM fixtures: the reference guest (driver) ---------------------------------------------------
# ``reference_image`` builds (or reuses) the cached Debian guest once per session;
# ``reference_guest`` is a factory booting fresh guests, each with its own overlay and ports,
# all of them killed when the test ends, whatever happened.


@pytest.fixture(scope="session")
def reference_image() -> ReferenceImage:
    """The reference guest image (built on first use, then reused from the cache)."""
    from vmtests.guest.image import reference_image as cached_image  # noqa: PLC0415

    return cached_image()


@pytest.fixture(scope="session")
def shared_reference_guest(
    request: pytest.FixtureRequest,
    reference_image: ReferenceImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[QemuMachine]:
    """One reference guest started once and shared by every test that can share it: booted and
    settled, restored from the snapshot cache when it can be.

    Such a test leaves the guest running and answering (it may reboot it). Its tests run on
    one xdist worker (marker ``xdist_group``), so the guest starts once per session.
    """
    from vmtests.guest.image import SETTLED, start_reference_guest  # noqa: PLC0415

    state_dir = tmp_path_factory.mktemp("shared-guest")
    guest = start_reference_guest(
        state_dir, name="shared", image=reference_image, preparation=SETTLED
    )
    try:
        yield guest
    finally:
        close_or_keep(request, guest, state_dir, REFERENCE_TARGET)


@pytest.fixture
def reference_guest(
    request: pytest.FixtureRequest, reference_image: ReferenceImage, tmp_path: Path
) -> Iterator[Callable[..., QemuMachine]]:
    """Factory: ``reference_guest(memory_mb=..., forward_ports=(8000,), name=...)`` -> started.

    Keyword arguments go to ``vmtests.guest.image.start_reference_guest``. Every guest gets a
    state directory under the test's ``tmp_path`` and is closed at teardown.
    """
    from vmtests.guest.image import start_reference_guest  # noqa: PLC0415

    guests: list[QemuMachine] = []

    def start(**kwargs: Any) -> QemuMachine:
        name = str(kwargs.pop("name", f"guest{len(guests)}"))
        state_dir = tmp_path / f"vm-{name}"
        guest = start_reference_guest(state_dir, name=name, image=reference_image, **kwargs)
        guests.append(guest)
        return guest

    try:
        yield start
    finally:
        for guest in guests:
            close_or_keep(request, guest, guest.state_dir, REFERENCE_TARGET)


# ---- --vmtests-keep: a failed test's guest stays ---------------------------------------------
# Whether a test failed reaches its fixtures through the item's stash, as pytest's documentation
# shows ("Making test result information available in fixtures", pytest_runtest_makereport);
# a session fixture asks whether any test that used it failed.

_KEEPING = pytest.StashKey[contextlib.ExitStack]()
_PHASES = pytest.StashKey[dict[str, pytest.TestReport]]()
_FAILED_FIXTURES = pytest.StashKey[set[str]]()
_TEARING_DOWN = pytest.StashKey[pytest.Item]()
KEPT_SECTION = "vmtests kept"
"""The report section (teardown) that holds a kept guest's attach and stop lines."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Keep each phase's report on the item, and the fixtures of a failed test."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    item.stash.setdefault(_PHASES, {})[report.when] = report
    if report.failed:
        failed = item.config.stash.setdefault(_FAILED_FIXTURES, set())
        failed.update(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The item being torn down: a session fixture's lines go to its report."""
    item.config.stash[_TEARING_DOWN] = item


def used_by_a_failed_test(request: pytest.FixtureRequest) -> bool:
    """Whether the test of a function fixture failed (setup or call), or, for a wider fixture,
    any test that used it."""
    if request.scope == "function":
        return any(report.failed for report in request.node.stash.get(_PHASES, {}).values())
    return request.fixturename in request.config.stash.get(_FAILED_FIXTURES, set())


def close_or_keep(
    request: pytest.FixtureRequest, machine: Machine, state_dir: Path, target: str
) -> None:
    """Close ``machine``; with ``--vmtests-keep`` and a failed test
    (``used_by_a_failed_test``), hand its QEMU guest to the keeper first (state in
    ``state_dir``) and report how to attach and stop."""
    config = request.config
    if config.getoption("--vmtests-keep") and used_by_a_failed_test(request):
        from vmtests.driver import keep, keep_run  # noqa: PLC0415

        keep_for = config.getoption("--vmtests-keep-for") or keep.DEFAULT_KEEP_FOR
        state = keep_run.RunState(state_dir)
        lines = keep_run.keep_machine(machine, state, keep_for=float(keep_for), target=target)
        item = config.stash.get(_TEARING_DOWN, None)
        if item is not None:
            item.add_report_section("teardown", KEPT_SECTION, "\n".join(lines))
    machine.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The kept guests' attach and stop lines (from every xdist worker's teardown reports),
    once more at the end of the session's summary."""
    section = f"Captured {KEPT_SECTION} teardown"
    kept = [
        content
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "teardown"
        for name, content in getattr(report, "sections", ())
        if name == section
    ]
    if kept:
        terminalreporter.write_sep("=", "vmtests: kept guests")
        for content in kept:
            terminalreporter.write_line(content)

"""On a running reference guest the backdoor has exactly the tool manifest, as on NixOS.

A program that Debian has but the manifest lacks fails with a message naming it and the
manifest; without ``setsid`` a reboot request fails at once instead of waiting out the reboot
timeout.
"""

from __future__ import annotations

import time

import pytest

from vmtests.driver.errors import CommandFailed
from vmtests.driver.qemu import QemuMachine
from vmtests.guest import toolpath

pytestmark = pytest.mark.vm


def test_backdoor_path_is_the_manifest_directory(shared_guest: QemuMachine) -> None:
    assert shared_guest.succeed('printf %s "$PATH"') == toolpath.TOOLS_DIR
    # bash plays sh, as in the NixOS backdoor (Debian's /bin/sh is dash).
    assert shared_guest.succeed('printf %s "$BASH_VERSION"') != ""


def test_a_program_outside_the_manifest_fails_naming_it(shared_guest: QemuMachine) -> None:
    # dpkg-query is installed in the image (it is Debian), but not in the tool manifest.
    shared_guest.succeed("test -x /usr/bin/dpkg-query")
    with pytest.raises(CommandFailed) as caught:
        shared_guest.succeed("dpkg-query -W bash")
    assert caught.value.result.rc == 127
    assert caught.value.missing == ["dpkg-query"]
    message = str(caught.value)
    assert message.startswith("`dpkg-query` not found on the machine's PATH (rc 127)")
    assert "tool manifest" in message


def test_reboot_without_setsid_fails_loudly_at_once(shared_guest: QemuMachine) -> None:
    """The guest as built from a manifest without ``setsid``: the reboot request is refused."""
    link = f"{toolpath.TOOLS_DIR}/setsid"
    shared_guest.succeed(f"mv {link} /root/setsid.off")
    boot = shared_guest.boot_id()
    try:
        start = time.monotonic()
        with pytest.raises(CommandFailed) as caught:
            shared_guest.reboot(timeout=300)
        elapsed = time.monotonic() - start
    finally:
        shared_guest.succeed(f"mv /root/setsid.off {link}")
    assert caught.value.missing == ["setsid"]
    assert "`setsid` not found" in str(caught.value)
    assert elapsed < 60, f"the refused reboot took {elapsed:.0f}s: it waited for a timeout"
    assert shared_guest.boot_id() == boot  # no reboot happened; the guest still answers

"""Per-host settings: the environment's, the host's YAML, the target's options (which win), and
clear errors for what does not parse or apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests.contracts.serving import READY_TIMEOUT, SERVING_CONTAINER
from vmtests.contracts.settings import REAL_HOST_DEFAULTS, REAL_HOST_ORIGIN, SettingError, Settings
from vmtests.guest.host_settings import resolve, split_target, ssh_options


def test_defaults_suit_the_reference_guest() -> None:
    target, settings = resolve("qemu:reference", environ={})
    assert target == "qemu:reference"
    assert settings == Settings()
    assert settings.ready_timeout == READY_TIMEOUT
    assert settings.container == SERVING_CONTAINER
    assert {source for _, _, source in settings.describe()} == {"default"}


def test_target_options_beat_the_host_yaml_which_beats_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "cfx-llm2.yaml"
    config.write_text(
        "# kept next to the host's configuration\nready_timeout: 3600\nreboot_timeout: 900\n"
        "api_key_file: /run/secrets/vllm.env\ncontainer: none\nsudo: true\n"
    )
    environ = {"VMTESTS_READY_TIMEOUT": "60", "VMTESTS_STOP_TIMEOUT": "240"}
    target, settings = resolve(
        "ssh://deploy@cfx-llm2:2222?ready_timeout=5400&identity_file=~/.ssh/cfx", config, environ
    )
    assert target == "ssh://deploy@cfx-llm2:2222"
    assert settings.ready_timeout == 5400
    assert settings.origin("ready_timeout") == "target option"
    assert settings.reboot_timeout == 900
    assert settings.origin("reboot_timeout") == f"--host-config {config}"
    assert settings.stop_timeout == 240
    assert settings.origin("stop_timeout") == "the environment"
    assert settings.api_key_file == "/run/secrets/vllm.env"
    assert settings.container is None  # none: the unit's MainPID is the server
    assert settings.identity_file == Path("~/.ssh/cfx").expanduser()
    assert ssh_options(settings) == {
        "connect_timeout": 15.0,
        "identity_file": Path("~/.ssh/cfx").expanduser(),
        "known_hosts": None,
        "strict_host_key_checking": True,
        "sudo": True,
    }
    shown = {name: (value, source) for name, value, source in settings.describe()}
    assert shown["ready_timeout"] == ("5400 s", "target option")
    assert settings.to_dict()["reboot_timeout"] == {
        "value": "900 s", "source": f"--host-config {config}",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("ssh://h?ready_timout=1", "unknown setting 'ready_timout'"),
        ("ssh://h?accel=tcg", "unknown setting 'accel'"),  # a setting, but not a host's
        ("ssh://h?ready_timeout=-5", "not a positive number of seconds"),
        ("ssh://h?sudo=maybe", "not a boolean"),
        ("ssh://h?serving_port=70000", "not a TCP port"),
        ("ssh://h?ready_timeout=1&ready_timeout=2", "given twice"),
        ("qemu:reference?known_hosts=/k", "ssh:// targets only"),
    ],
)
def test_what_does_not_parse_or_apply_is_a_usage_error(target: str, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        resolve(target, environ={})


def test_a_host_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    config = tmp_path / "h.yaml"
    config.write_text("- ready_timeout\n")
    with pytest.raises(SettingError, match="expected a mapping"):
        resolve("ssh://h", config)
    with pytest.raises(SettingError, match="--host-config"):
        resolve("ssh://h", tmp_path / "missing.yaml")


def test_split_target_keeps_a_target_without_options() -> None:
    assert split_target("ssh://root@[::1]:22") == ("ssh://root@[::1]:22", {})
    assert split_target("ssh://h?container=none") == ("ssh://h", {"container": "none"})


def test_an_ssh_target_gets_a_real_hosts_timeouts_where_nothing_set_them(tmp_path: Path) -> None:
    # The reference guest's 300 s would end a P150's vLLM start (up to 3600 s, more with an
    # empty tensor cache) as "not ready", and a POST of minutes as "did not come back".
    config = tmp_path / "cfx-llm2.yaml"
    config.write_text("reboot_timeout: 1200\n")
    environ = {"VMTESTS_SWITCH_TIMEOUT": "2400"}
    _, real = resolve("ssh://root@cfx-llm2", config, environ)
    assert real.ready_timeout == float(REAL_HOST_DEFAULTS["ready_timeout"]) >= 3600
    assert real.origin("ready_timeout") == REAL_HOST_ORIGIN
    assert real.reboot_timeout == 1200  # a host's file wins over the real host's default
    assert real.switch_timeout == 2400  # so does the environment
    assert real.stop_timeout == Settings().stop_timeout
    _, guest = resolve("qemu:reference", environ={})
    assert guest.ready_timeout == READY_TIMEOUT

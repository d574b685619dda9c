"""The settings file (broker/settings.py): flags over the file over the
defaults, paths beside the file, unknown or invalid settings refused with
their name, and what a reload changes, keeps for a restart, or resets."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.broker import settings
from shoal.broker.cli import config_from_args


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_flags_win_over_the_file_which_wins_over_defaults(tmp_path: Path) -> None:
    f = write(tmp_path / "s.toml", 'heartbeat = 7\nframe-max = 8192\nload-definitions = "d.json"\n')
    config = config_from_args(["--config", f, "--heartbeat", "60"])
    assert (config.heartbeat, config.frame_max, config.channel_max) == (60, 8192, 2047)
    assert config.load_definitions == str(tmp_path / "d.json")  # beside the file
    assert config.config == f and "heartbeat" in config.cli_flags


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("nope = 1\n", "unknown setting 'nope'"),
        ('heartbeat = "soon"\n', "Expected `int`, got `str` - at `$.heartbeat`"),
        ('log-level = "loud"\n', "log level 'loud'"),
        ("memory-high-watermark = 2.0\n", "is a fraction, 0 to 1"),
        ("heartbeat = \n", "cannot read"),
        ('auth-mechanisms = "PLAIN,CRAM-MD5"\n', "auth mechanisms CRAM-MD5: choose from"),
    ],
)
def test_a_bad_file_is_refused_with_the_setting_named(
    tmp_path: Path, text: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "s.toml", text)
    with pytest.raises(SystemExit) as exit_:
        config_from_args(["--config", f])
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err


def test_reload_applies_what_it_can_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    f = write(path, "heartbeat = 7\ncatalog-mb = 16\nconsumer-timeout = 5000\n")
    current = config_from_args(["--config", f, "--port", "5999"])
    write(path, "heartbeat = 9\ncatalog-mb = 8\nport = 1234\nworkers = 3\n")
    new, changes = settings.reload(current)
    assert (new.heartbeat, new.catalog_mb, new.port, new.workers) == (9, 16, 5999, 3)
    assert new.consumer_timeout == 1_800_000  # gone from the file: its default again
    assert changes == [
        "workers: 0 -> 3",
        "catalog_mb: 16 -> 8 needs a restart; still 16",
        "heartbeat: 7 -> 9",
        "consumer_timeout: 5000 -> 1800000",
    ]
    write(path, "heartbeat = [\n")
    with pytest.raises(settings.SettingsError, match="cannot read"):
        settings.reload(new)


def test_the_example_file_names_only_known_settings(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "deploy" / "shoal.toml"
    lines = example.read_text().splitlines()
    settings_lines = [line[2:] for line in lines if line.startswith("# ") and " = " in line]
    assert len(settings_lines) > 10
    uncommented = write(tmp_path / "all.toml", "\n".join(settings_lines) + "\n")
    assert settings.read_file(uncommented)["workers"] == 4


@pytest.mark.parametrize(
    ("option", "default"), [("--mqtt-prefetch", 1000), ("--mqtt-receive-maximum", 4096)]
)
def test_mqtt_windows_are_counts_of_1_to_65535(
    capsys: pytest.CaptureFixture[str], option: str, default: int
) -> None:
    field = option[2:].replace("-", "_")
    assert getattr(config_from_args([]), field) == default
    assert getattr(config_from_args([option, "65535"]), field) == 65535
    for bad in ("0", "65536"):
        with pytest.raises(SystemExit):
            config_from_args([option, bad])
        assert f"{option} is a count, 1 to 65535" in capsys.readouterr().err


def test_mqtt_max_keep_alive_is_0_to_65535_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert config_from_args([]).mqtt_max_keep_alive == 0  # no maximum, as RabbitMQ
    assert config_from_args(["--mqtt-max-keep-alive", "65535"]).mqtt_max_keep_alive == 65535
    for bad in ("-1", "65536"):
        with pytest.raises(SystemExit):
            config_from_args(["--mqtt-max-keep-alive", bad])
        assert "--mqtt-max-keep-alive is in seconds, 0 to 65535" in capsys.readouterr().err


def test_an_mqtts_port_needs_a_certificate() -> None:
    with pytest.raises(SystemExit):  # argparse's error, with the reason
        config_from_args(["--mqtts-port", "8883"])
    config = config_from_args(
        ["--mqtts-port", "8883", "--tls-cert", "/c.pem", "--mqtt-port", "1883"]
    )
    assert (config.mqtt_port, config.mqtts_port) == (1883, 8883)


def test_the_mqtt_listeners_are_on_by_default_mqtts_only_with_a_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As RabbitMQ with its MQTT plugins: 1883, and 15675 for WebSocket;
    8883 opens once a certificate is configured (the default port without
    one is no error, unlike --mqtts-port asked for, flag or file)."""
    config = config_from_args([])
    assert (config.mqtt_port, config.mqtts_port, config.mqtt_ws_port) == (1883, 8883, 15675)
    assert not config.mqtts_listening() and not config.serves_tls()
    assert config_from_args(["--tls-cert", "/c.pem"]).mqtts_listening()
    off = config_from_args(["--tls-cert", "/c.pem", "--mqtts-port", "0", "--mqtt-ws-port", "0"])
    assert not off.mqtts_listening() and off.mqtt_ws_port == 0
    with pytest.raises(SystemExit):
        config_from_args(["--config", write(tmp_path / "s.toml", "mqtts-port = 8884\n")])
    assert "--mqtts-port needs --tls-cert" in capsys.readouterr().err


def test_two_listeners_on_one_port_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args(["--port", "1883"])
    assert "--port and --mqtt-port are both 1883" in capsys.readouterr().err
    config_from_args(["--port", "1883", "--mqtt-port", "0"])
    config_from_args(["--port", "8883"])  # MQTTS is not listening without a certificate


def test_auth_mechanisms_are_plain_and_amqplain_unless_listed(tmp_path: Path) -> None:
    """RabbitMQ's auth_mechanisms: EXTERNAL only where named; a flag or the
    file, a comma-separated string or a list."""
    assert config_from_args([]).auth_mechanisms == ("PLAIN", "AMQPLAIN")
    flag = config_from_args(["--auth-mechanisms", "plain,external"])
    assert flag.auth_mechanisms == ("PLAIN", "EXTERNAL")
    f = write(tmp_path / "s.toml", 'auth-mechanisms = ["AMQPLAIN", "EXTERNAL"]\n')
    assert config_from_args(["--config", f]).auth_mechanisms == ("AMQPLAIN", "EXTERNAL")

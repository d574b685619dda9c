"""The broker's settings from a file (`--config FILE`, TOML) as well as flags,
and what a SIGHUP reloads (issue 16, item 7).

The file holds any setting by its flag's name (`heartbeat = 30`,
`log-level = "debug"`, `load-definitions = "/etc/shoal/definitions.json"`;
dashes or underscores). A flag given on the command line wins over the file,
the file over the defaults. At SIGHUP the supervisor reads the file again:
the settings in RELOADABLE apply at once (to new connections where they are
per connection), a new `workers` asks for that many IO workers
(broker/supervisor/scaling.py), and any other change is logged and waits
for the next start. The supervisor writes what it resolved to
`<runtime dir>/settings.msgpack`, from which the IO workers and the
scheduler take it at their own SIGHUP (one reading of the file for all).
"""

from __future__ import annotations

import logging
import os
import tomllib
from typing import Any

import msgspec

from shoal.broker.config import Config, parse_auth_mechanisms

SETTINGS_FILE = "settings.msgpack"

# Applied by a SIGHUP. Per-connection limits apply to connections opened
# after it; the memory marks and the TLS certificates to everyone.
RELOADABLE = frozenset(
    {
        "log_level",
        "tls_cert",
        "tls_key",
        "tls_ca",
        "tls_fail_if_no_peer_cert",
        "graceful_timeout",
        "frame_max",
        "channel_max",
        "mqtt_prefetch",
        "mqtt_receive_maximum",
        "mqtt_max_keep_alive",
        "mqtt_colocate",
        "heartbeat",
        "handshake_timeout",
        "max_handshaking",
        "consumer_timeout",
        "max_message_size",
        "memory_high_watermark",
        "arena_high_watermark",
        "memory_low_watermark",
        "disk_free_limit",
        "default_capacity",
        "default_flow_resume_capacity",
        "loopback_users",
        "load_definitions",
        "workers",  # through the worker count at runtime
    }
)
# File names in the file: relative ones are relative to the file's directory.
PATHS = frozenset({"load_definitions", "tls_cert", "tls_key", "tls_ca", "runtime_dir", "data_dir"})
# Never taken from the file.
NOT_IN_FILE = frozenset({"config", "cli_flags"})


class SettingsError(Exception):
    """The file cannot be read, or a setting in it is unknown or invalid."""


def read_file(path: str) -> dict[str, Any]:
    """The file's settings by Config field name."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read {path}: {exc}") from None
    known = set(Config.__struct_fields__) - NOT_IN_FILE
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise SettingsError(f"{path}: unknown setting '{key}'")
        if name == "loopback_users" and isinstance(value, str):
            value = tuple(u for u in value.split(",") if u)
        if name == "auth_mechanisms":
            try:
                value = parse_auth_mechanisms(value)
            except (ValueError, AttributeError) as exc:
                raise SettingsError(f"{path}: {exc}") from None
        if name == "bind" and isinstance(value, str):
            value = (value,)  # one address, or a list of them
        if name in PATHS and isinstance(value, str) and value:
            value = os.path.join(os.path.dirname(os.path.abspath(path)), value)  # beside it
        settings[name] = value
    return settings


def resolve(flags: dict[str, Any], given: frozenset[str], path: str) -> Config:
    """The settings: `flags` (every flag's value, defaults included), of
    which `given` were on the command line, over the file at `path`."""
    values = dict(flags)
    in_file = read_file(path) if path else {}
    for name, value in in_file.items():
        if name not in given:
            values[name] = value
    for name in ("load_definitions",):  # read again at SIGHUP, maybe from elsewhere
        if values.get(name):
            values[name] = os.path.abspath(values[name])
    values["config"] = os.path.abspath(path) if path else ""
    values["cli_flags"] = tuple(sorted(given))
    try:
        config = msgspec.convert(values, Config)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{path or 'flags'}: {exc}") from None
    problems = check(config, given | frozenset(in_file))
    if problems:
        raise SettingsError(f"{path or 'flags'}: {problems[0]}")
    return config


def check(c: Config, explicit: frozenset[str] = frozenset()) -> list[str]:
    """What is wrong with a combination of settings (none: []); `explicit`:
    the settings a flag or the file gave, not their defaults."""
    problems = []
    if c.default_capacity < 0 or c.default_flow_resume_capacity < 0:
        problems.append("--default-capacity and --default-flow-resume-capacity are bytes >= 0")
    if c.default_flow_resume_capacity > (c.default_capacity or 0):
        problems.append("--default-flow-resume-capacity is above --default-capacity")
    if c.tls_port and not c.tls_cert:
        problems.append("--tls-port needs --tls-cert (and --tls-key unless the key is in it)")
    # The default MQTTS port just stays closed without a certificate (as
    # RabbitMQ's); one asked for is an error, as --tls-port's.
    if c.mqtts_port and not c.tls_cert and "mqtts_port" in explicit:
        problems.append("--mqtts-port needs --tls-cert (and --tls-key unless the key is in it)")
    listeners: dict[int, str] = {}  # port -> the first flag that opens it
    for name, port, on in (
        ("port", c.port, c.plain_listener),
        ("tls-port", c.tls_port, True),
        ("mqtt-port", c.mqtt_port, True),
        ("mqtts-port", c.mqtts_port, c.mqtts_listening()),
        ("mqtt-ws-port", c.mqtt_ws_port, True),
    ):
        if port and on and port in listeners:
            problems.append(f"--{listeners[port]} and --{name} are both {port}")
        elif port and on:
            listeners[port] = name
    for name in ("mqtt_prefetch", "mqtt_receive_maximum"):
        if not 1 <= getattr(c, name) <= 0xFFFF:
            problems.append(f"--{name.replace('_', '-')} is a count, 1 to 65535")
    if not 0 <= c.mqtt_max_keep_alive <= 0xFFFF:
        problems.append("--mqtt-max-keep-alive is in seconds, 0 to 65535")
    if not c.plain_listener and not c.tls_port:
        problems.append("--no-plain-listener needs --tls-port: no listener is left")
    for name in ("memory_high_watermark", "arena_high_watermark", "memory_low_watermark"):
        if not 0 <= getattr(c, name) <= 1:
            problems.append(f"--{name.replace('_', '-')} is a fraction, 0 to 1")
    if c.log_level not in ("debug", "info", "warning", "error"):
        problems.append(f"log level '{c.log_level}': debug, info, warning or error")
    return problems


def reload(current: Config) -> tuple[Config, list[str]]:
    """SIGHUP: the file read again over the current command line. Returns
    the settings to run with (what needs a restart kept as it is) and a
    line for each change."""
    flags = msgspec.structs.asdict(current)
    given = frozenset(current.cli_flags)
    defaults = msgspec.structs.asdict(Config())
    for name in flags:  # a setting removed from the file goes back to its default
        if name not in given and name not in NOT_IN_FILE:
            flags[name] = defaults[name]
    fresh = msgspec.structs.asdict(resolve(flags, given, current.config))
    changes = []
    for name, value in fresh.items():
        old = getattr(current, name)
        if value == old or name in NOT_IN_FILE:
            continue
        if name in RELOADABLE:
            changes.append(f"{name}: {old!r} -> {value!r}")
        else:
            changes.append(f"{name}: {old!r} -> {value!r} needs a restart; still {old!r}")
            fresh[name] = old
    return msgspec.convert(fresh, Config), changes


def write_runtime(config: Config, runtime_dir: str) -> None:
    """Write the settings for the children's SIGHUP (atomically: rename)."""
    path = os.path.join(runtime_dir, SETTINGS_FILE)
    with open(path + ".tmp", "wb") as f:
        f.write(msgspec.msgpack.encode(config))
    os.replace(path + ".tmp", path)


def read_runtime(runtime_dir: str) -> Config:
    with open(os.path.join(runtime_dir, SETTINGS_FILE), "rb") as f:
        return msgspec.msgpack.decode(f.read(), type=Config)


def apply_log_level(config: Config) -> None:
    logging.getLogger().setLevel(config.log_level.upper())

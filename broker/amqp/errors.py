"""AMQP errors with RabbitMQ-style reply texts (client test suites match on them)."""

from __future__ import annotations

from pamqp import constants

ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
CONNECTION_FORCED = 320
INVALID_PATH = 402
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

_NAMES = {
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}
assert constants.FRAME_END == 206


def reply_text(code: int, detail: str) -> str:
    """`NOT_FOUND - no queue 'q1' in vhost '/'`: the name of the code, then why."""
    return f"{_NAMES.get(code, 'ERROR')} - {detail}"


def fit_shortstr(text: str) -> str:
    """A reply text over a shortstr's 255 bytes as RabbitMQ cuts it
    (rabbit_binary_generator): its first 252 bytes and "..."."""
    raw = text.encode()
    if len(raw) <= 255:
        return text
    return raw[:252].decode(errors="ignore") + "..."


class AMQPError(Exception):
    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.reply_code = code
        self.reply_text = fit_shortstr(
            detail if detail.startswith(_NAMES.get(code, "\0")) else reply_text(code, detail)
        )
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.reply_text)


class ChannelError(AMQPError):
    """Closes the channel it happened on."""


class ConnectionError_(AMQPError):
    """Closes the whole connection."""


# How long RabbitMQ keeps a client it does not trust waiting before it drops
# the socket (its ?SILENT_CLOSE_DELAY): no quick retries of bad logins.
SILENT_CLOSE_DELAY = 3.0


class SilentClose(ConnectionError_):
    """A handshake RabbitMQ answers without a frame: the socket closes
    `delay` seconds later, or when the client closes its end, and what the
    client sends meanwhile is dropped: a malformed login response, an
    unknown mechanism, a refused login of a client that did not announce
    authentication_failure_close. The reply text is for the log only."""

    def __init__(self, code: int, detail: str, delay: float = SILENT_CLOSE_DELAY) -> None:
        super().__init__(code, detail)
        self.delay = delay


def no_queue(name: str, vhost: str) -> str:
    return f"no queue '{name}' in vhost '{vhost}'"


def locked_queue(name: str, vhost: str) -> str:
    return (
        f"cannot obtain exclusive access to locked queue '{name}' in vhost "
        f"'{vhost}'. It could be originally declared on another connection or the "
        "exclusive property value does not match that of the original declaration."
    )

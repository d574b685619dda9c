"""Queue and exchange names as RabbitMQ takes them.

RabbitMQ accepts any UTF-8 name of at most 255 bytes (a shortstr): spaces,
punctuation, non-ASCII letters. pamqp checks names against a grammar of its
own (`[a-zA-Z0-9-_.:@#,/+ ]*`) whenever it builds or encodes a method, so a
queue called `café`, `jobs!` or `a$b` made Shoal's queue.declare-ok, a
basic.get-ok or basic.return from an exchange so named raise, and the
connection closed with 541. The grammar is widened here, once, for every
process that imports the AMQP model: the length check stays pamqp's.

rabbit_channel also strips CR and LF from the names of queue.declare,
queue.delete, exchange.declare, exchange.delete and the four bindings'
queues and exchanges (`strip_cr_lf`): `"orders\\n"` is `orders`.
"""

from __future__ import annotations

import re

from pamqp import constants

_ANY_NAME = re.compile(r".*", re.DOTALL)
for _domain in ("exchange-name", "queue-name"):
    constants.DOMAIN_REGEX[_domain] = _ANY_NAME


def strip_cr_lf(name: str) -> str:
    """`name` without carriage returns and line feeds (rabbit_channel's)."""
    if "\n" in name or "\r" in name:
        return name.replace("\n", "").replace("\r", "")
    return name

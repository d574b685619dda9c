"""The AMQP model without IO: errors and RabbitMQ's reply texts, exchange
routing, the definitions (vhosts, exchanges, bindings) and their journal
operations, message selectors. Nothing here opens a socket, forks or reads
shared memory (tests/test_layout.py)."""

# Imported for its effect, by everything that imports the AMQP model: pamqp's
# name grammar widened to RabbitMQ's (any UTF-8), see names.py.
from shoal.broker.amqp import names as _names  # noqa: F401

"""The AMQP model without IO: errors and RabbitMQ's reply texts, exchange
routing, the definitions (vhosts, exchanges, bindings) and their journal
operations, message selectors. Nothing here opens a socket, forks or reads
shared memory (tests/test_layout.py)."""

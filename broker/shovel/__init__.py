"""Dynamic shovels, as RabbitMQ's (docs/shovels.md): move messages from a
queue or an exchange on one broker to a queue or an exchange on another."""

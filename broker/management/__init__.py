"""The HTTP management API (issue 16, item 6): RabbitMQ's, for what tools use."""

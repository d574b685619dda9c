"""The scheduler process: queue and definition lifecycle, and which consumer
is told about a queue's work (Qpid's QueueConsumerManager)."""

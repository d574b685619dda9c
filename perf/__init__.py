"""``shoal perf``: a fast AMQP 0-9-1 load generator.

Each producer and consumer is its own OS process with its own uvloop event loop and one
connection, so the load generator scales with cores and is not the bottleneck of the
broker it measures.  The hot paths avoid a general AMQP library: publishes are
precomputed byte templates (a batch of messages is one bytes multiplication and one
``transport.write``), and incoming frames are split by hand with ``struct.unpack_from``
over the receive buffer.  pamqp is used only for the handshake and rare methods.

Latency: every body starts with the producer's ``time.monotonic_ns()`` (CLOCK_MONOTONIC
is system-wide, so producer and consumer clocks agree on one machine).  Messages of one
batch are written by one ``write`` call and so share a send time.

Modules, in the order a run uses them:

- ``cli``: the command line (``shoal perf``, ``python -m shoal.perf``) and ``main``.
- ``config``: ``PerfConfig`` (one run's options), the shared ``Window`` and phase limits.
- ``runner``: declares the queues, forks the producer and consumer processes, starts
  them together and collects their results.
- ``connection``: one AMQP connection (handshake, RPCs, the frames off the hot path).
- ``producer`` and ``consumer``: the two kinds of child process and their hot paths.
- ``wire``: hand-built frames (publish templates, acks) and the frame splitter.
- ``stats``: the mergeable latency histogram.
- ``report``: the aggregated result and its human-readable form.
"""

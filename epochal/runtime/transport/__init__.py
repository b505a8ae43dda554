"""The transport: connections between the driver and the tasks and among tasks, used on
both sides.

* ``wire`` — framed, pickled messages over TCP with a mutual HMAC handshake (generation
  fencing), peer timeouts, and the connection server;
* ``tls`` — mutually authenticated TLS 1.3 pinned to a certificate made per attempt;
* ``channels`` — data channels: batches, barriers and watermarks in FIFO order, with
  credit-based flow control (``OutputChannel``, ``InputGate``).

May import: :mod:`epochal.serde`, :mod:`epochal.errors`, :mod:`epochal.time.watermarks`
(the in-band watermark mark). Nothing else of the runtime: ``driver`` and ``task`` build
on it.
"""

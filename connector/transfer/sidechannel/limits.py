"""What one peer can cost the side channel: per-frame limits, queue depths, handshake time, sockets.

libzmq buffers an unfinished multipart message whole, however many frames it has, and
``MAXMSGSIZE`` bounds one frame only: with a key, ZMQ's CURVE mechanism runs first and a ZAP
handler admits only clients whose CURVE key derives from a fleet key the ring accepts
(curve_keys.py), so a peer without the key never gets past the handshake (no message frame is
buffered for it); what it can make the server hold is one handshake frame of at most
``MAXMSGSIZE`` per connection, dropped after ``HANDSHAKE_MS``. Complete messages queue at most
``RCVHWM`` per connection.
"""

from __future__ import annotations

from pdfleet.connector.transfer import wire

# Per-frame limits libzmq enforces (it disconnects the peer): a request frame is at most
# the codec's limit plus ZMTP/CURVE framing; a reply frame likewise.
SERVER_MAX_FRAME = wire.MAX_REQUEST_BYTES + 4096
CLIENT_MAX_FRAME = wire.MAX_REPLY_BYTES + 4096
SERVER_RCVHWM = 128  # complete messages queued per connection before libzmq stops reading it
CLIENT_RCVHWM = 64
HANDSHAKE_MS = 2000  # a connection that has not finished the ZMTP/CURVE handshake by then is dropped
MAX_SOCKETS = 256  # client sockets (one per endpoint) kept open at most
IDLE_SOCKET_SECONDS = 30.0  # a client socket with no call for this long is closed
DROP_LOG_INTERVAL = 10.0

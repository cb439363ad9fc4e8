"""ZMQ side channel: a ROUTER server thread on the source (server.py), a non-blocking DEALER client
on the sink (client.py).

Keyed, CURVE keeps peers without a fleet key out at the ZMTP handshake (curve_keys.py) and every
message carries an HMAC (auth.py); limits.py bounds what one peer can cost; pool.py decides which
client socket goes when the pool is full; affinity.py starts the server's threads unpinned.
The names below are the package's API (callers import them from here).
"""

from __future__ import annotations

from pdfleet.connector.transfer.sidechannel.addresses import check_bind_host, zmq_address
from pdfleet.connector.transfer.sidechannel.affinity import unpinned
from pdfleet.connector.transfer.sidechannel.client import Call, SideChannelClient, reply_judged_at
from pdfleet.connector.transfer.sidechannel.curve_keys import curve_client_keys, secure_client_socket
from pdfleet.connector.transfer.sidechannel.errors import SideChannelError
from pdfleet.connector.transfer.sidechannel.pool import pool_victim
from pdfleet.connector.transfer.sidechannel.server import SideChannelServer

__all__ = ["SideChannelServer", "SideChannelClient", "Call", "SideChannelError", "zmq_address", "check_bind_host",
           "reply_judged_at", "secure_client_socket", "curve_client_keys", "pool_victim", "unpinned"]

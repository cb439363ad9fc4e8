"""A peer without the key that speaks raw ZMTP 3 (NULL mechanism) over TCP and streams frames of one
multipart message that never ends. (pyzmq cannot do this: libzmq only sends a message once its last
frame is queued.) As a client: ``flood_server(host, port, seconds)``. As a rogue "prefill" in its own
process: ``python zmtp_flood.py`` prints its port, then floods whoever connects."""

from __future__ import annotations

import socket
import struct
import sys
import time

MiB = 1024 * 1024


def _greeting(as_server: bool) -> bytes:
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
            + bytes([1 if as_server else 0]) + b"\x00" * 31)


def _ready(socket_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return bytes([0x04, len(body)]) + body


def handshake(sock: socket.socket, *, as_server: bool, socket_type: bytes) -> bool:
    """Greet and send READY; False when the peer hung up (e.g. it insists on CURVE)."""
    sock.sendall(_greeting(as_server))
    got = b""
    sock.settimeout(3.0)
    try:
        while len(got) < 64:
            chunk = sock.recv(64 - len(got))
            if not chunk:
                return False
            got += chunk
    except OSError:
        return False
    if got[12:32].rstrip(b"\x00") != b"NULL":
        return False
    try:
        sock.sendall(_ready(socket_type))
    except OSError:
        return False
    return True


def stream(sock: socket.socket, seconds: float, cap: int = 600 * MiB, frame: int = MiB) -> int:
    """Send 'more' frames of ``frame`` bytes for ``seconds`` (at most ``cap`` bytes); returns bytes sent."""
    head = bytes([0x03]) + struct.pack(">Q", frame)  # MORE | LONG
    body = b"\x00" * frame
    sent = 0
    end = time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < end and sent < cap:
        try:
            sock.sendall(head + body)
            sent += frame
        except socket.timeout:
            continue
        except OSError:
            break
    return sent


def flood_server(host: str, port: int, seconds: float, cap: int = 600 * MiB) -> int:
    with socket.create_connection((host, port), timeout=3.0) as sock:
        if not handshake(sock, as_server=False, socket_type=b"DEALER"):
            return 0
        sent = stream(sock, seconds, cap)
        time.sleep(1.0)  # let the receiver take in what is on the wire
        return sent


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    print(srv.getsockname()[1], flush=True)
    total = 0
    srv.settimeout(30)
    try:
        while True:
            conn, _ = srv.accept()
            with conn:
                if handshake(conn, as_server=True, socket_type=b"ROUTER"):
                    total += stream(conn, seconds, 400 * MiB)
                    time.sleep(1.0)
                print(total, flush=True)
    except (socket.timeout, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()

"""Where the side channel listens and dials: ZMQ addresses, and the bind host checked (the pod IP, never
every interface unless insisted on)."""

from __future__ import annotations

__all__ = ["zmq_address", "check_bind_host"]

_WILDCARDS = {"0.0.0.0", "::", "*", "[::]"}


def zmq_address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def check_bind_host(host: str, allow_wildcard: bool = False) -> str:
    if not isinstance(host, str) or not host.strip():
        raise ValueError(
            "side-channel host is empty: set VLLM_NIXL_SIDE_CHANNEL_HOST to this pod's IP"
        )
    host = host.strip()
    if host in _WILDCARDS and not allow_wildcard:
        raise ValueError(
            f"side-channel host {host!r} binds every interface; pass the pod IP"
            " (or allow_wildcard_bind=True to insist)"
        )
    return host

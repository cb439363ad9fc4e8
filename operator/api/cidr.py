"""A NetworkPolicy ipBlock's CIDRs, checked before apply: in Python with ipaddress, and in the CRD with a
regular expression (CEL `matches`, RE2) that accepts the same strings.

Kubernetes' CEL `isCIDR()` would say it in one call, but it came with the CEL IP/CIDR library of Kubernetes 1.31,
and a CRD whose rule names a function the API server lacks is refused whole; the chart supports 1.30. The two
checks are held to each other by a table test (tests/unit/api/test_cidr.py)."""

from __future__ import annotations

import ipaddress

MESSAGE = "must be a CIDR: an IPv4 or IPv6 address, '/', and a prefix length (e.g. 10.0.0.0/8 or fd00::/8)"
EXCEPT_MESSAGE = "every except entry must lie inside cidr"
MAX_LENGTH = 64  # the longest IPv6 CIDR with an embedded IPv4 is 49 characters; bounds CEL's cost

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_V4 = rf"({_OCTET}\.){{3}}{_OCTET}"
_H = r"[0-9a-fA-F]{1,4}"
_V6 = "|".join((
    rf"({_H}:){{7}}{_H}",
    rf"({_H}:){{1,7}}:",
    rf"({_H}:){{1,6}}:{_H}",
    rf"({_H}:){{1,5}}(:{_H}){{1,2}}",
    rf"({_H}:){{1,4}}(:{_H}){{1,3}}",
    rf"({_H}:){{1,3}}(:{_H}){{1,4}}",
    rf"({_H}:){{1,2}}(:{_H}){{1,5}}",
    rf"{_H}:(:{_H}){{1,6}}",
    rf":((:{_H}){{1,7}}|:)",
    rf"({_H}:){{6}}{_V4}",  # an IPv4 tail: full, or after a '::'
    rf"({_H}:){{1,5}}:{_V4}",
    rf"::({_H}:){{0,5}}{_V4}",
))
PATTERN = rf"^({_V4}/(3[0-2]|[12]?[0-9])|({_V6})/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))$"


def is_cidr(value: str) -> bool:
    """An address, '/', and a prefix length written without leading zeros, in range for the address family."""
    address, slash, prefix = value.partition("/")
    if not slash or "%" in address or not prefix.isascii() or not prefix.isdigit() or str(int(prefix)) != prefix:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return int(prefix) <= ip.max_prefixlen


def within(inner: str, outer: str) -> bool:
    """Whether CIDR inner lies inside CIDR outer (both valid), as the API server's NetworkPolicy check has it."""
    a, b = ipaddress.ip_network(inner, strict=False), ipaddress.ip_network(outer, strict=False)
    return a.version == b.version and a.subnet_of(b)


def cel_rule() -> dict[str, str]:
    """The CRD's rule on a CIDR string (RE2 in CEL's single-quoted literal: backslashes doubled)."""
    return {"rule": "self.matches('" + PATTERN.replace("\\", "\\\\") + "')", "message": MESSAGE}

"""Scale to zero as a P/D pair (issue 41): the names the front ends (the waiting room in
connector/serving/) and the operator (operator/autoscale/scale_to_zero.py) share.

The front ends hold requests while no pair is ready and expose how many they hold; the operator
reads that gauge from every ready front end's /metrics and writes 0 -> 1 on both roles' scalers."""

from __future__ import annotations

# gauge: requests a front end (router or Endpoint Picker) holds in its waiting room for a pair
ROUTER_WAITING_REQUESTS = "pdfleet_router_waiting_requests"

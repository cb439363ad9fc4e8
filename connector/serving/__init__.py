"""The serving pipeline both front ends share (the router's HTTP handlers, the gateway's Endpoint Picker):
the request, the decision core, the prefill leg, flow control, KV-aware scoring, leases, timing."""

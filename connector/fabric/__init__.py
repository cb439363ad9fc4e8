"""The fabric preflight: does UCX move KV over the transport the fleet asked for, fast enough?

verdict.py is the pure decision (table-tested on captured UCX/NIXL output); loopback.py is
the measured NIXL READ (run in its own process so UCX's own log is captured); probe.py runs
it and decides; `python -m pdfleet.connector.fabric` is the pod's init container.
"""

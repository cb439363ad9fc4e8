"""The operator's Kubernetes edge, shared by reconcile and autoscale: what the watches observed
(`observed`, pure parsing) and the client every write goes through (`client`).

It imports only `plan.kinds` and the contract, never reconcile or autoscale, so both stand on it
and neither imports the other's internals (tests/unit/test_layering.py keeps it so).
"""

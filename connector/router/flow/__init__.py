"""Flow control in the router: a bounded, priority- and tenant-aware queue in front of the legs.

- config.py: the settings (``FlowControlConfig``), parsed from the router's ``--flow-control`` JSON;
- discipline.py: the pure queue discipline (admit, dispatch, shed), table-tested;
- gate.py: the asyncio edge the router's handler awaits, with its ``pdfleet_router_flow_*`` metrics.
"""

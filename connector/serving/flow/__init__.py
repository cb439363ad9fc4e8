"""Flow control in the router: a bounded, priority- and tenant-aware queue in front of the legs.

- config.py: the settings (``FlowControlConfig``), parsed from the router's ``--flow-control`` JSON;
- discipline.py: the pure queue discipline (admit, dispatch, shed), table-tested;
- cost.py: a request's estimated cost (prompt tokens + max_tokens), what fairness shares;
- gate.py: the asyncio edge front ends await (``admit``; the router's ``guard``), with its ``pdfleet_router_flow_*`` metrics.
"""

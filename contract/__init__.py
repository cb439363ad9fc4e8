"""pdfleet's contract: every value the operator, the connector and the router must agree on.

Standard library only, so that the operator, the connector inside vLLM and the router
import the same module. A value both halves read or write (a label key, a port, a
connector config key, a ``kv_transfer_params`` key, a policy or metric name) is spelled
here once and imported everywhere else; tests/unit/contract/test_spelled_once.py fails
when product code spells one of them again.

- labels.py: label and annotation keys;
- ports.py: port numbers and port names;
- env.py: environment variable names;
- connector_config.py: the connector's ``kv_connector_extra_config`` (one typed object, one set of defaults);
- router_config.py: the router's configuration, which renders and parses its own argv;
- routing.py: routing policy names, the block hash the router reproduces, response headers;
- metrics.py: the router metric names the planner and dashboards read;
- fabric.py: the fabric preflight's verdict (what the init container writes, the operator reads);
- kv_params.py: ``kv_transfer_params``, versioned (the connector writes, the router and decode read).
"""

"""The Gateway API Inference Extension's Endpoint Picker Protocol, as the gateway and the EPP spell it.

GAIE (inference.networking.k8s.io) docs, "Endpoint Picker Protocol": the EPP is an Envoy ext_proc
server that names the chosen ``ip:port`` in a request header and in dynamic metadata under the
same key; the proxy may hand it a subset to pick from. Standard library only.
"""

from __future__ import annotations

# The chosen endpoint, "ip:port": request header (read by the ORIGINAL_DST cluster) and the key in
# the dynamic metadata namespace below.
DESTINATION_ENDPOINT_HEADER = "x-gateway-destination-endpoint"
DESTINATION_METADATA_NAMESPACE = "envoy.lb"
# The proxy's subset hint: metadata namespace and key; a list of "ip:port" (or one comma-separated string).
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_HINT_KEY = "x-gateway-destination-endpoint-subset"
# The endpoint that served the request, "ip:port", as the gateway reports it back (GAIE #1226, #3003): key
# in the response's metadata namespace DESTINATION_METADATA_NAMESPACE (or a response header of that name).
DESTINATION_SERVED_KEY = "x-gateway-destination-endpoint-served"

# grpc.health.v1 service names the EPP answers on its ext_proc port and its health port (GAIE's Endpoint Picker Protocol,
# "Health Checking", #2514): "" and HEALTH_LIVENESS while the process serves; HEALTH_READINESS and the ext_proc
# service's own name (Envoy's grpc_health_check service_name) while a revision has ready endpoints.
HEALTH_LIVENESS = "liveness"
HEALTH_READINESS = "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"

EPP_GRPC = 9002  # the EPP's ext_proc gRPC port (GAIE's default for endpointPickerRef.port)
EPP_METRICS = 9090  # the EPP's /metrics and /health (HTTP)

# `pdfleet epp` takes the router's flags (contract/router_config.py: endpoint discovery, picking,
# limits; its --host/--port are the EPP's HTTP listener for /health and /metrics, EPP_METRICS in a
# pod) plus this one, the ext_proc gRPC port the InferencePool's endpointPickerRef names.
GRPC_PORT_FLAG = "--grpc-port"
GRPC_PORT_NAME = "grpc"  # the ext_proc port's name on the EPP's container and Service

# Secure serving, as GAIE's reference EPP has it (--secure-serving, default true; --cert-path): ext_proc over
# TLS, because the gateways that dial an InferencePool's picker (Envoy AI Gateway, agentgateway) speak TLS to it
# and verify nothing. The certificate: tls.crt and tls.key in the --cert-path folder, else a self-signed one made
# at start (connector/epp/tls.py). --no-secure-serving serves h2c (a gateway on the same host, the tests).
SECURE_SERVING_FLAG = "--secure-serving"
NO_SECURE_SERVING_FLAG = "--no-" + SECURE_SERVING_FLAG.removeprefix("--")  # argparse's BooleanOptionalAction
CERT_PATH_FLAG = "--cert-path"
TLS_CERT_FILE = "tls.crt"  # a kubernetes.io/tls Secret's keys, so such a Secret mounts as the folder
TLS_KEY_FILE = "tls.key"
# grpc.health.v1 alone, in plaintext, for the kubelet's gRPC probes (they cannot speak TLS): GAIE's
# --grpc-health-port. The ext_proc port answers grpc.health.v1 too, over its own transport.
GRPC_HEALTH_PORT_FLAG = "--grpc-health-port"
EPP_GRPC_HEALTH = 9003
GRPC_HEALTH_PORT_NAME = "grpc-health"

# Who may call the EPP (docs/gateway.md, "Who may call the Endpoint Picker"): the gateway sends the fleet's
# EPP caller token in this gRPC metadata key on every ext_proc stream (Envoy: grpc_service.initial_metadata);
# the EPP refuses any other caller with UNAUTHENTICATED (connector/epp/caller_auth.py).
CALLER_TOKEN_METADATA = "x-pdfleet-epp-token"
# `pdfleet epp` refuses to start without a caller token (contract.env.EPP_CALLER_TOKEN) unless given this
# flag, which serves every caller: only for a port that nothing but the local gateway can reach.
INSECURE_ANY_CALLER_FLAG = "--insecure-any-caller"
# spec.gateway.inferencePool.callerAuth: how the Endpoint Picker knows its gateway. Token: the fleet's
# caller token in the ext_proc stream's metadata (the default); None: anyone the NetworkPolicy admits
# (for gateways that cannot send metadata, e.g. agentgateway; the EPP runs with INSECURE_ANY_CALLER_FLAG).
CALLER_AUTH_TOKEN = "Token"
CALLER_AUTH_NONE = "None"

FAIL_OPEN = "FailOpen"  # InferencePool endpointPickerRef.failureMode: the proxy routes on without the EPP
FAIL_CLOSE = "FailClose"  # the proxy answers 5xx when the EPP cannot be reached
FAILURE_MODES = (FAIL_OPEN, FAIL_CLOSE)

"""Label and annotation keys on a fleet's children (the operator writes them; the router and the
operator's watches select on them)."""

from __future__ import annotations

PREFIX = "pdfleet.io/"
FLEET = "pdfleet.io/fleet"  # on every child: the DisaggregatedInference's name
ROLE = "pdfleet.io/role"  # prefill | decode | router | epp
REVISION = "pdfleet.io/revision"  # the fleet template's hash (plan/naming.py: revision)
GROUP = "pdfleet.io/group"  # replica index of a per-replica LeaderWorkerSet (gang scheduling)
# On the engine Services (and so on their EndpointSlices) of the revision that serves new
# requests: the operator is its only publisher, the router's discovery reads it.
SERVING = "pdfleet.io/serving"
SERVING_TRUE = "true"
# On the engine Services (so their EndpointSlices) of a canary revision (issue 22): the percent of new
# requests (an integer 0..100) the router sends to that pair; the serving pair takes the rest. The
# operator changes only this label between steps, so the router's pod template stays the same.
CANARY_WEIGHT = "pdfleet.io/canary-weight"

# Annotations
APPLIED_HASH = "pdfleet.io/applied-hash"  # hash of the manifest the operator last applied
GENERATED = "pdfleet.io/generated"  # on a Secret the operator generated (the fleet's side-channel key)
REPORTING_COMPONENT = "pdfleet.io/operator"  # Events' reportingComponent
# On the DisaggregatedInference: a person overrides a canary (the operator removes it once acted on).
ROLLOUT = "pdfleet.io/rollout"
ROLLOUT_PROMOTE = "promote"
ROLLOUT_ABORT = "abort"

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_ROUTER = "router"
ROLE_EPP = "epp"  # the Endpoint Picker behind a Gateway (spec.gateway.inferencePool)
FRONT_END_ROLES = (ROLE_ROUTER, ROLE_EPP)  # the engines' callers: they hold the API token, serve the pipeline
ENGINE_ROLES = (ROLE_PREFILL, ROLE_DECODE)

"""Environment variable names that one part sets and another reads."""

from __future__ import annotations

# The connector's side channel (names follow vLLM's NixlConnector): the address decode dials
# (a pod's IP, from the downward API; never a wildcard) and the port of TP rank 0.
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# The engines' block-hash seed; the router must hash with the same one.
HASH_SEED = "PYTHONHASHSEED"
# The router's defaults for --fleet and --namespace.
FLEET = "PDFLEET_FLEET"
# The fleet's uid: only Services whose owner reference carries it are the fleet's (the operator sets it).
FLEET_UID = "PDFLEET_FLEET_UID"
POD_NAMESPACE = "POD_NAMESPACE"
# Set by `pdfleet local` for its engines; pdfleet's connector then lowers vLLM's shared-memory
# reader re-check interval to that many milliseconds (connector/adapter/vllm_workarounds.py).
VLLM_SHM_RECHECK_MS = "PDFLEET_VLLM_SHM_RECHECK_MS"
# Set by `pdfleet local` for engines that share a CPU with another engine: pdfleet's connector caps
# how long vLLM's shared-memory readers spin (sched_yield) after a read before they park.
VLLM_SHM_SPIN_MS = "PDFLEET_VLLM_SHM_SPIN_MS"
# Set by `pdfleet local` beside VLLM_SHM_SPIN_MS: inside that spin window the readers sleep this many
# microseconds between polls instead of calling sched_yield, so a waiting reader leaves the CPU to the
# process working beside it (connector/adapter/vllm_workarounds.py).
VLLM_SHM_SPIN_NAP_US = "PDFLEET_VLLM_SHM_SPIN_NAP_US"
# Test-only fault hooks (connector/testhooks.py), off unless set to an absolute file path; while
# that file exists: a decode's NIXL READs are never posted (they stay in progress, a stuck READ),
# or the engine's wall clock (time.time) is stepped by the seconds the file holds.
TEST_STUCK_READS = "PDFLEET_TEST_STUCK_READS"
TEST_WALL_CLOCK_STEP = "PDFLEET_TEST_WALL_CLOCK_STEP"
# Test-only fault hook (connector/testhooks.py) for the end-to-end negative controls: "1", or an absolute
# file path while that file exists, makes a decode worker overwrite every block it pulled with noise.
TEST_CORRUPT_PULLED_BLOCKS = "PDFLEET_TEST_CORRUPT_PULLED_BLOCKS"
# The bearer token the engines require on their OpenAI API (issue 30): vLLM reads it from VLLM_API_KEY
# (its --api-key, never in args); the router (and the EPP) send it, from ENGINE_API_KEY, on every
# upstream request. Both come from the fleet's generated Secret through secretKeyRef.
VLLM_API_KEY = "VLLM_API_KEY"
ENGINE_API_KEY = "PDFLEET_ENGINE_API_KEY"
# The Endpoint Picker's caller token (docs/gateway.md, "Who may call the Endpoint Picker"): `pdfleet epp` serves
# only ext_proc streams that carry it (gateway.CALLER_TOKEN_METADATA); in a cluster from the fleet's generated
# Secret <fleet>-epp-caller through secretKeyRef.
EPP_CALLER_TOKEN = "PDFLEET_EPP_CALLER_TOKEN"
# Every test-only hook's name starts so: a fleet spec may never set one (validate, CRD, plan refuse it).
TEST_PREFIX = "PDFLEET_TEST_"

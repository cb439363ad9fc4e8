"""The DisaggregatedInference API (pdfleet.io/v1alpha1): types, rules, parsing."""

from pdfleet.operator.api.rules import FieldError, Rule, SPEC_RULES, gpus, spec_errors
from pdfleet.operator.api.types import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    DisaggregatedInference,
    DisaggregatedInferenceSpec,
    DisaggregatedInferenceStatus,
    RoleSpec,
)
from pdfleet.operator.api.validation import InvalidResource, errors_of, parse
from pdfleet.operator.api import scaler  # noqa: E402, F401  (after types: it imports crd)

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAMES", "SINGULAR", "VERSION",
    "DisaggregatedInference", "DisaggregatedInferenceSpec", "DisaggregatedInferenceStatus", "RoleSpec",
    "FieldError", "Rule", "SPEC_RULES", "InvalidResource", "errors_of", "gpus", "parse", "spec_errors",
]

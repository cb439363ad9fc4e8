"""Parse a resource (a dict, as read from YAML or the API) into the API types.

Every problem comes back as a FieldError naming the field and what is allowed;
nothing is dropped or coerced silently (types are strict, as on the API server).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pydantic import ValidationError

from pdfleet.operator.api.rules import FieldError, spec_errors
from pdfleet.operator.api.types import DisaggregatedInference


class InvalidResource(ValueError):
    """A resource that breaks the API; `errors` says where and why."""

    def __init__(self, errors: Iterable[FieldError]):
        self.errors = list(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def _message(err: Mapping[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "required field is missing"
    return str(err["msg"])


def _is_union_branch(part: Any) -> bool:
    # pydantic adds the union member it tried ("int", "constrained-str", ...) to the location
    return isinstance(part, str) and (part in {"int", "str", "bool"} or part.startswith("constrained-"))


def pydantic_errors(exc: ValidationError) -> list[FieldError]:
    """One FieldError per field; the branches of a union are joined with 'or'."""
    messages: dict[str, list[str]] = {}
    for err in exc.errors():
        path = _path(tuple(p for p in err["loc"] if not _is_union_branch(p)))
        found = messages.setdefault(path, [])
        if _message(err) not in found:
            found.append(_message(err))
    return [FieldError(path, " or ".join(msgs)) for path, msgs in messages.items()]


def parse(obj: Any) -> DisaggregatedInference:
    """The resource as API types, or InvalidResource listing every error."""
    if not isinstance(obj, Mapping):
        raise InvalidResource([FieldError("(root)", f"expected a mapping (a YAML object), got {type(obj).__name__}")])
    try:
        resource = DisaggregatedInference.model_validate(dict(obj), strict=True)
    except ValidationError as exc:
        raise InvalidResource(pydantic_errors(exc)) from None
    errors = spec_errors(resource.spec)
    if errors:
        raise InvalidResource(errors)
    return resource


def errors_of(obj: Any) -> list[FieldError]:
    """All errors of a resource; empty when it is valid."""
    try:
        parse(obj)
    except InvalidResource as exc:
        return exc.errors
    return []

"""A router that cannot load its tokenizer says so: pdfleet_router_tokenizer_loaded (0 with the reason, 1 once
loaded) and /health's prefix_routing.tokenizer_reason; before, one warning in the log was all."""

from __future__ import annotations

import errno

import huggingface_hub.errors as hub
import pytest

from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting
from pdfleet.connector.serving.kvaware.tokenizer import failure_reason
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.local.tiny_model import TinyLlamaSpec, build_tokenizer


def _hub_error(cls: type, message: str) -> BaseException:
    """A Hub HTTP error without an HTTP response (its constructor wants one)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    return exc


def _wrapped(*chain: BaseException) -> BaseException:
    """chain[0] raised from chain[1] from ..., as transformers wraps the Hub's errors in OSError."""
    for outer, inner in zip(chain, chain[1:]):
        outer.__cause__ = inner
    return chain[0]


TABLE = [
    (_wrapped(OSError("You are trying to access a gated repo."), _hub_error(hub.GatedRepoError, "401")),
     names.TOKENIZER_GATED),
    (OSError("You are trying to access a gated repo.\nMake sure to have access"), names.TOKENIZER_GATED),
    (_wrapped(OSError("We couldn't connect to 'https://huggingface.co'"), hub.LocalEntryNotFoundError("offline"),
              OSError("[Errno -2] Name or service not known")), names.TOKENIZER_UNREACHABLE),
    (_wrapped(OSError("not a valid model identifier"), _hub_error(hub.RepositoryNotFoundError, "404")),
     names.TOKENIZER_NOT_FOUND),
    (_wrapped(OSError("Repo id must be in the form"), hub.HFValidationError("/models/llama")), names.TOKENIZER_NOT_FOUND),
    (ValueError("Couldn't instantiate the backend tokenizer from one of: ..."), names.TOKENIZER_NOT_FOUND),
    (OSError(errno.EROFS, "Read-only file system", "/home/nonroot/.cache/huggingface"),
     names.TOKENIZER_CACHE_NOT_WRITABLE),
    (_wrapped(OSError("could not write"), PermissionError(errno.EACCES, "Permission denied")),
     names.TOKENIZER_CACHE_NOT_WRITABLE),
    (ModuleNotFoundError("No module named 'transformers'"), names.TOKENIZER_NO_TRANSFORMERS),
    (RuntimeError("something else"), names.TOKENIZER_FAILED),
]


@pytest.mark.parametrize("exc,reason", TABLE)
def test_failure_reason(exc, reason) -> None:
    assert failure_reason(exc) == reason
    assert reason in names.TOKENIZER_REASONS


def test_a_cause_loop_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert failure_reason(a) == names.TOKENIZER_FAILED


def _series(metrics: RouterMetrics) -> dict[str, float]:
    return {s.labels[names.TOKENIZER_REASON]: s.value for m in metrics.registry.collect()
            if m.name == names.ROUTER_TOKENIZER_LOADED for s in m.samples}


async def _started(tokenizer: str) -> tuple[PrefixRouting, RouterMetrics]:
    metrics = RouterMetrics()
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=16,
                                         tokenizer=tokenizer), metrics)
    await routing.start()
    assert _series(metrics) in ({names.TOKENIZER_LOADING: 0.0}, {names.TOKENIZER_LOADED: 1.0},
                                {names.TOKENIZER_NOT_FOUND: 0.0})  # loading, or already done
    await routing.wait_ready()
    await routing.stop()
    return routing, metrics


async def test_a_router_that_cannot_load_its_tokenizer_reports_it(tmp_path) -> None:
    """A model path without tokenizer files (a PVC not mounted where the model name points): 0, NotFound."""
    routing, metrics = await _started(str(tmp_path))
    assert _series(metrics) == {names.TOKENIZER_NOT_FOUND: 0.0}
    status = routing.status()
    assert (status["tokenizer"], status["tokenizer_reason"]) == (False, names.TOKENIZER_NOT_FOUND)


async def test_a_router_that_loads_its_tokenizer_reports_it(tmp_path) -> None:
    """Control: the same router with the tokenizer's files there reports 1, Loaded (one series only)."""
    build_tokenizer(TinyLlamaSpec()).save_pretrained(tmp_path)
    routing, metrics = await _started(str(tmp_path))
    assert _series(metrics) == {names.TOKENIZER_LOADED: 1.0}
    assert (routing.status()["tokenizer"], routing.status()["tokenizer_reason"]) == (True, names.TOKENIZER_LOADED)

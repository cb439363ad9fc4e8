"""`pdfleet local` says whether the router's prefix routing has the model's tokenizer, and why not."""

from __future__ import annotations

import pytest

from pdfleet.contract import metrics
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.local.router_and_gateway import start_router, tokenizer_line, wait_for_tokenizer


@pytest.mark.parametrize("reason,says", [
    (None, None),
    (metrics.TOKENIZER_LOADED, "prefix routing: the router hashes prompts with the model's tokenizer"),
    (metrics.TOKENIZER_GATED, "prefix routing: the router has no tokenizer (Gated)"),
    (metrics.TOKENIZER_NOT_FOUND, "prefix routing: the router has no tokenizer (NotFound)"),
])
def test_tokenizer_line(reason, says) -> None:
    line = tokenizer_line(reason)
    assert line == says if says is None or reason == metrics.TOKENIZER_LOADED else line.startswith(says)


async def test_a_local_router_without_its_tokenizer_says_why(tmp_path, capsys) -> None:
    """A real router in this process, its --tokenizer a folder without the files: stderr names the reason."""
    config = RouterConfig(prefill=("http://127.0.0.1:9",), decode=("http://127.0.0.1:9",), block_size=16,
                          tokenizer=str(tmp_path))
    runner, _ = await start_router(config, 0)
    try:
        await wait_for_tokenizer(runner)
    finally:
        await runner.cleanup()
    err = capsys.readouterr().err
    assert f"prefix routing: the router has no tokenizer ({metrics.TOKENIZER_NOT_FOUND})" in err, err

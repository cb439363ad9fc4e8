"""Pure router decisions: when a relayed stream has ended, and what status a request is counted under."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.outcome import CLIENT_CLOSED, StreamEnd, recorded_status

CHUNK = b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"


def feed_all(chunks) -> list[bool]:
    end = StreamEnd()
    return [end.feed(c) for c in chunks]


@pytest.mark.parametrize("stream", [
    CHUNK + DONE,
    CHUNK + USAGE + DONE,
    DONE,  # an empty stream
    CHUNK + b"data:[DONE]\n\n",  # SSE allows no space after the colon
    CHUNK.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n",
])
@pytest.mark.parametrize("split", [None, 1, 5, 13])
def test_stream_ends_at_done_however_it_is_split(stream, split):
    chunks = [stream] if split is None else [stream[i:i + split] for i in range(0, len(stream), split)]
    seen = feed_all(chunks)
    assert seen[-1] is True
    assert not any(seen[:-1])  # not one chunk early


@pytest.mark.parametrize("stream", [
    CHUNK,  # no end yet
    CHUNK + USAGE,  # usage came, [DONE] not yet
    CHUNK + b"data: [DONE]\n",  # the event is not finished until its blank line
    CHUNK + b"data: [DONE]",
    # "[DONE]" inside a chunk's text: JSON cannot hold a raw newline, so this is no event of its own
    b'data: {"choices":[{"text":"data: [DONE]\\n\\n"}]}\n\n',
    b'data: {"choices":[{"text":"x data: [DONE]',
    CHUNK + b"xdata: [DONE]\n\n",  # not at the start of a line
    CHUNK + DONE + CHUNK,  # something after [DONE]: the stream went on
])
def test_stream_not_ended(stream):
    assert feed_all([stream])[-1] is False
    assert feed_all([stream[i:i + 3] for i in range(0, len(stream), 3)])[-1] is False


def test_done_after_a_long_stream_fed_byte_by_byte():
    stream = CHUNK * 50 + USAGE + DONE
    seen = feed_all([stream[i:i + 1] for i in range(len(stream))])
    assert seen[-1] is True and not any(seen[:-1])


def test_empty_chunks_change_nothing():
    end = StreamEnd()
    assert end.feed(DONE) is True
    assert end.feed(b"") is True


@pytest.mark.parametrize("sent, delivered, client_left, expected", [
    (200, True, False, 200),   # served, nobody closed early
    (200, True, True, 200),    # client closed right after [DONE]: still served
    (200, False, True, CLIENT_CLOSED),  # client left mid-stream
    (None, False, True, CLIENT_CLOSED),  # client left during prefill
    (200, False, False, 200),  # a whole (non-streamed) answer handed to aiohttp
    (400, False, False, 400),
    (502, False, False, 502),
    (400, True, True, 400),    # a relayed 4xx that reached the client
    (None, False, False, 500),  # nothing sent and nobody left: the router failed
])
def test_recorded_status(sent, delivered, client_left, expected):
    assert recorded_status(sent, delivered=delivered, client_left=client_left) == expected

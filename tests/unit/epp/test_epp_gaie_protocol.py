"""GAIE protocol parity, the pure half (connector/epp/protocol.py, messages.py, health.py, gateway_modes.py):
what a response body message gets back in each body mode, the mode the EPP asks for, what an exchange's end
means for a lease, subset hints in the reference EPP's forms, the served endpoint, the health statuses."""

from __future__ import annotations

import logging

import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

from pdfleet.connector.epp import health, messages, protocol
from pdfleet.connector.epp.gateway_modes import GatewayModes
from pdfleet.connector.serving import lease_release
from pdfleet.contract.gateway import (
    DESTINATION_METADATA_NAMESPACE,
    DESTINATION_SERVED_KEY,
    EXT_PROC_SERVICE,
    HEALTH_LIVENESS,
    HEALTH_READINESS,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
)

FD = protocol.FULL_DUPLEX


@pytest.mark.parametrize("mode, reply", [
    (FD, protocol.ECHO),  # the old empty answer here: Envoy's "Spurious response message", 500
    (protocol.STREAMED, protocol.ACK),
    (protocol.BUFFERED, protocol.ACK),
    (protocol.BUFFERED_PARTIAL, protocol.ACK),
    (protocol.NONE, protocol.ACK),
])
def test_response_body_reply_by_mode(mode, reply):
    assert protocol.response_body_reply(mode) == reply


@pytest.mark.parametrize("end", [False, True])
def test_echo_carries_the_chunk_back_and_its_end(end):
    reply = messages.response_body(protocol.ECHO, b"data: t0\n\n", end)
    streamed = reply.response_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b"data: t0\n\n", end)


def test_ack_is_an_empty_body_response():
    reply = messages.response_body(protocol.ACK, b"chunk", True)
    assert reply.WhichOneof("response") == "response_body" and not reply.response_body.HasField("response")


@pytest.mark.parametrize("request_mode, response_mode, wanted", [
    (protocol.BUFFERED, protocol.NONE, {"request_body_mode": "BUFFERED", "response_body_mode": "NONE"}),
    (protocol.BUFFERED, protocol.STREAMED, {"request_body_mode": "BUFFERED", "response_body_mode": "STREAMED"}),
    (protocol.STREAMED, protocol.STREAMED, {"request_body_mode": "BUFFERED", "response_body_mode": "STREAMED"}),
    (protocol.STREAMED, protocol.BUFFERED, {"request_body_mode": "BUFFERED", "response_body_mode": "BUFFERED"}),
    (FD, FD, None),
    (FD, protocol.STREAMED, None),
    (protocol.STREAMED, FD, None),  # Envoy takes no override beside FULL_DUPLEX_STREAMED
])
def test_mode_override(request_mode, response_mode, wanted):
    got = protocol.mode_override(request_mode, response_mode)
    if wanted is None:
        assert got is None
    else:
        assert got == {**wanted, "request_header_mode": "SEND", "response_header_mode": "SEND",
                       "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"}


def test_mode_override_travels_as_enum_values():
    reply = messages.continue_headers(mode_override=protocol.mode_override(protocol.STREAMED, protocol.NONE))
    assert reply.mode_override.request_body_mode == ProcessingMode.BUFFERED
    assert reply.mode_override.response_header_mode == ProcessingMode.SEND
    assert not messages.continue_headers().HasField("mode_override")


@pytest.mark.parametrize("mode, end, early", [
    (protocol.STREAMED, False, True),
    (protocol.STREAMED, True, False),
    (protocol.BUFFERED, False, False),
    (FD, False, False),
])
def test_streamed_too_early(mode, end, early):
    assert protocol.streamed_too_early(mode, end) is early


@pytest.mark.parametrize("status, expected, verdict", [
    (None, True, lease_release.CLIENT_GONE),
    (None, False, protocol.UNOBSERVED),  # response headers skipped: the old CLIENT_GONE released every lease
    (200, False, protocol.TAKEN),
    (500, True, lease_release.DECODE_FAILED),
    (404, False, lease_release.DECODE_REFUSED),
])
def test_lease_verdict_at_the_end(status, expected, verdict):
    assert protocol.lease_verdict(status, status_expected=expected) == verdict


@pytest.mark.parametrize("value, subset", [
    (["10.0.0.1"], frozenset({"10.0.0.1"})),
    (["10.0.0.1:8000,10.0.0.2:8000", "10.0.0.3:9"], frozenset({"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:9"})),
    ("10.0.0.1, 10.0.0.2:8000", frozenset({"10.0.0.1", "10.0.0.2:8000"})),
    (["fd00::7"], frozenset({"[fd00::7]"})),
    (["[fd00::7]:8000"], frozenset({"[fd00::7]:8000"})),
    ([",", " "], frozenset()),
])
def test_subset_hint_in_the_reference_epps_forms(value, subset):
    assert protocol.subset_hint({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: value}}) == subset


@pytest.mark.parametrize("subset, kept", [
    (frozenset({"10.0.0.1"}), ("http://10.0.0.1:8000", "http://10.0.0.1:8001")),  # any port of that IP (was: none)
    (frozenset({"10.0.0.1:8001"}), ("http://10.0.0.1:8001",)),
    (frozenset({"10.0.0.2", "[fd00::7]"}), ("http://[fd00::7]:8000",)),
    (frozenset({"10.0.0"}), ()),
])
def test_within_a_bare_ip(subset, kept):
    candidates = ("http://10.0.0.1:8000", "http://10.0.0.1:8001", "http://[fd00::7]:8000")
    assert protocol.within(candidates, subset) == kept


@pytest.mark.parametrize("metadata, headers, served", [
    ({DESTINATION_METADATA_NAMESPACE: {DESTINATION_SERVED_KEY: "10.0.0.2:8000"}}, {}, "10.0.0.2:8000"),
    ({}, {DESTINATION_SERVED_KEY: "10.0.0.3:8000"}, "10.0.0.3:8000"),
    ({DESTINATION_METADATA_NAMESPACE: {DESTINATION_SERVED_KEY: "10.0.0.2:8000"}},
     {DESTINATION_SERVED_KEY: "10.0.0.3:8000"}, "10.0.0.2:8000"),  # metadata first
    ({}, {DESTINATION_SERVED_KEY: "10.0.0.4:1, 10.0.0.5:1"}, "10.0.0.4:1"),
    ({DESTINATION_METADATA_NAMESPACE: {"other": "x"}}, {}, None),
    ({}, {}, None),
])
def test_served_endpoint(metadata, headers, served):
    assert protocol.served_endpoint(metadata, headers) == served


@pytest.mark.parametrize("served, url", [
    (None, "http://10.0.0.1:8000"),
    ("10.0.0.1:8000", "http://10.0.0.1:8000"),
    ("10.0.0.2:8000", "http://10.0.0.2:8000"),  # the gateway's word: that decode failed, not the chosen one
    ("10.9.9.9:1", "http://10.0.0.1:8000"),  # one the EPP does not know
])
def test_served_url(served, url):
    assert protocol.served_url(served, "http://10.0.0.1:8000", ("http://10.0.0.1:8000", "http://10.0.0.2:8000")) == url


@pytest.mark.parametrize("ready, readiness", [(True, health.SERVING), (False, health.NOT_SERVING)])
def test_health_statuses(ready, readiness):
    assert health.statuses(ready) == {"": health.SERVING, HEALTH_LIVENESS: health.SERVING,
                                      HEALTH_READINESS: readiness, EXT_PROC_SERVICE: readiness}


@pytest.mark.parametrize("mode, presumed", [(protocol.NONE, False), (protocol.STREAMED, True),
                                            (protocol.BUFFERED, True), (FD, True)])
def test_response_headers_presumed(mode, presumed):
    assert protocol.response_headers_presumed(mode) is presumed


def test_gateway_modes_learn_per_body_modes_and_say_once(caplog):
    modes = GatewayModes()
    assert not modes.responds("BUFFERED", "NONE") and modes.responds(FD, FD)  # presumed from the response mode
    modes.responded("BUFFERED", "NONE")
    assert modes.responds("BUFFERED", "NONE") and not modes.responds("STREAMED", "NONE")
    with caplog.at_level(logging.WARNING, logger="pdfleet.epp"):
        for _ in range(3):
            modes.unobserved(FD, FD)
            modes.announced(protocol.STREAMED, protocol.STREAMED)
            modes.announced(protocol.BUFFERED, protocol.STREAMED)  # nothing to say
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "response_header_mode SKIP" in said[0] and "allow_mode_override" in said[1]


@pytest.mark.parametrize("request_mode, response_mode, needle", [
    (protocol.STREAMED, FD, "Envoy takes no mode_override there"),
    (protocol.STREAMED, protocol.STREAMED, "asks for BUFFERED"),
    (protocol.NONE, protocol.STREAMED, "cannot route"),
    (protocol.BUFFERED, protocol.BUFFERED, "holds decode's whole answer"),
])
def test_mode_problems_name_the_setting(request_mode, response_mode, needle):
    assert any(needle in p for p in protocol.mode_problems(request_mode, response_mode))


@pytest.mark.parametrize("request_mode, response_mode", [(FD, FD), (protocol.BUFFERED, protocol.STREAMED),
                                                         (FD, protocol.STREAMED), (protocol.BUFFERED, FD)])
def test_no_problem_with_the_shipped_and_gaie_modes(request_mode, response_mode):
    assert protocol.mode_problems(request_mode, response_mode) == []

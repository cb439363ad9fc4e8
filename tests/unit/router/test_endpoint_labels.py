"""Endpoint names in metrics (issue 20 row 8): <role>-<n>, stable while known, reused after."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.endpoint_labels import UNKNOWN, EndpointLabels

P, D = "prefill", "decode"


@pytest.mark.parametrize("steps, expected", [
    # one update: new endpoints in URL order, ordinals per role
    ([({"http://b:1": P, "http://a:1": P, "http://c:1": D}, ())],
     {"http://a:1": "prefill-0", "http://b:1": "prefill-1", "http://c:1": "decode-0"}),
    # a name stays with its endpoint when others come and go
    ([({"http://a:1": P, "http://b:1": P}, ()), ({"http://b:1": P}, ()), ({"http://b:1": P, "http://z:1": P}, ())],
     {"http://b:1": "prefill-1", "http://z:1": "prefill-0"}),
    # an endpoint that left but has legs in flight keeps its name; the newcomer gets another
    ([({"http://a:1": P}, ()), ({"http://n:1": P}, ("http://a:1",))],
     {"http://a:1": "prefill-0", "http://n:1": "prefill-1"}),
    # ... and gives it up once its legs are done
    ([({"http://a:1": P}, ()), ({"http://n:1": P}, ("http://a:1",)), ({"http://n:1": P, "http://m:1": P}, ())],
     {"http://n:1": "prefill-1", "http://m:1": "prefill-0"}),
    # pods churning through new IPs never grow the label set
    ([({f"http://10.0.0.{i}:8000": D}, ()) for i in range(50)], {"http://10.0.0.49:8000": "decode-0"}),
])
def test_names(steps, expected):
    labels = EndpointLabels()
    for known, keep in steps:
        labels.update(known, keep)
    assert labels.names() == expected


def test_freed_names_are_returned_and_unknown_urls_have_no_address():
    labels = EndpointLabels()
    labels.update({"http://10.1.2.3:8000": P})
    assert labels("http://10.1.2.3:8000") == "prefill-0"
    assert labels.update({}) == {"http://10.1.2.3:8000": "prefill-0"}
    assert labels("http://10.1.2.3:8000") == UNKNOWN

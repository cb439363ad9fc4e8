"""Flow control's queue discipline (connector/serving/flow/discipline.py): admit, dispatch, shed."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.flow.discipline import FlowQueue, Item, decode_queue, headroom, retry_after_s


def q(*weights: int, max_queued: int = 100, max_wait_s: float = 10.0) -> FlowQueue:
    return FlowQueue(list(weights), max_queued, max_wait_s)


def items(spec: str, t0: float = 0.0) -> list[Item]:
    """'0a 0a 1b' -> items of class 0 tenant a, class 0 tenant a, class 1 tenant b; arriving 1 s apart."""
    return [Item(tenant=w[1:], klass=int(w[0]), arrived=t0 + i) for i, w in enumerate(spec.split())]


def names(out: list[Item]) -> str:
    return " ".join(f"{i.klass}{i.tenant}" for i in out)


def offer_all(fq: FlowQueue, its: list[Item]) -> None:
    for it in its:
        assert not fq.offer(it).refused


# (case, weights, arrivals, in_flight, capacity, dispatched in order)
DISPATCH = [
    ("one tenant: FIFO", [1], "0a 0a 0a", 0, 3, "0a 0a 0a"),
    ("tenants round robin, FIFO within each", [1], "0a 0a 0a 0b 0c", 0, 5, "0a 0b 0c 0a 0a"),
    ("capacity bounds the dispatch", [1], "0a 0b 0c", 1, 3, "0a 0b"),
    ("nothing free: nothing dispatched", [1], "0a", 3, 3, ""),
    ("weights 3:1 share the dispatches", [3, 1], "0a 0a 0a 0a 0a 0a 0a 0a 0a 0a 1b 1b 1b 1b 1b 1b 1b 1b 1b 1b",
     0, 100, "0a 1b 0a 0a 0a 1b 0a 0a 0a 1b 0a 0a 0a 1b 1b 1b 1b 1b 1b 1b"),
    ("equal weights alternate", [1, 1], "0a 0a 0a 1b 1b 1b", 0, 100, "0a 1b 0a 1b 0a 1b"),
    # capacity 10, 2 classes: 2 slots kept for the top class
    ("lower classes leave the headroom free", [1, 1], "1a 1a 1a", 7, 10, "1a"),
    ("the top class may take the headroom", [1, 1], "1a 0b 1a", 9, 10, "0b"),
    ("top first on a tie, then the low class up to the headroom", [1, 1], "1a 0b 1a", 8, 10, "0b"),
    ("one class: no headroom", [1], "0a 0a 0a", 8, 10, "0a 0a"),
]


@pytest.mark.parametrize("case,weights,arrivals,in_flight,capacity,expected", DISPATCH, ids=[d[0] for d in DISPATCH])
def test_dispatch_order(case, weights, arrivals, in_flight, capacity, expected) -> None:
    fq = q(*weights)
    offer_all(fq, items(arrivals))
    out = fq.dispatch(in_flight, capacity)
    assert names(out) == expected
    assert fq.size == len(arrivals.split()) - len(out)


@pytest.mark.parametrize("in_flight,lower_capacity,low,high", [
    (0, None, 15, 5),  # capacity 20, headroom 5: the low class up to 15, the top class the rest
    (0, 16, 11, 9),  # the low class bounded by 16 - 5; the top class still up to 20
    (11, 16, 0, 9),  # the low class at its bound: only the top class starts
    (0, 40, 15, 5),  # a lower bound above capacity is capacity
    (0, 0, 0, 20),  # negative control of the bound's reach: nothing below the top class
])
def test_lower_classes_take_their_headroom_from_the_lower_capacity(in_flight, lower_capacity, low, high) -> None:
    fq = q(8, 1)
    offer_all(fq, items(" ".join(["1a"] * 30)))
    out = fq.dispatch(in_flight, 20, lower_capacity)
    assert len(out) == low and all(i.klass == 1 for i in out)
    offer_all(fq, items(" ".join(["0b"] * 30), t0=100.0))
    out = fq.dispatch(in_flight + low, 20, lower_capacity)
    assert names(out) == " ".join(["0b"] * high)


def test_an_idle_high_class_is_served_at_the_next_slot_not_behind_the_backlog() -> None:
    fq = q(8, 1)
    offer_all(fq, items(" ".join(["1a"] * 50)))
    assert len(fq.dispatch(0, 21)) == 16  # capacity 21: lower classes leave 5 free
    assert fq.dispatch(16, 21) == []  # saturated for the low class
    high = Item("b", 0, 60.0)
    fq.offer(high)
    assert fq.dispatch(20, 21) == [high]  # the headroom takes it at once
    # a slot frees with the backlog still there: the next high request is next, whatever the low backlog's tags
    high2 = Item("b", 0, 61.0)
    fq.offer(high2)
    assert fq.dispatch(15, 21)[:1] == [high2]


def test_a_busy_high_class_does_not_starve_the_low_one() -> None:
    fq = q(8, 1)
    offer_all(fq, items(" ".join(["0a"] * 90 + ["1b"] * 10)))
    out = fq.dispatch(0, 1000)[:45]
    assert sum(i.klass == 1 for i in out) == 5  # 1/9 of the dispatches while both wait


# (case, weights, queued, arrival, refused, displaced (class+tenant) or "")
SHED = [
    ("a higher arrival displaces the newest of the longest low flow", [2, 1], "1a 1a 1b", "0c", False, "1a"),
    ("same class, shorter flow: displaces the longest", [1], "0a 0a 0b", "0c", False, "0a"),
    ("same class, as long as the longest: the arrival is refused", [1], "0a 0a 0b", "0b", True, ""),
    ("same class, its own flow is the longest: refused", [1], "0a 0a 0b", "0a", True, ""),
    ("everything queued is more important: refused", [2, 1], "0a 0b 0c", "1d", True, ""),
    ("the lowest waiting class is the victim", [3, 2, 1], "0a 1b 1b", "0c", False, "1b"),
    ("lowest class below the arrival, longest flow there", [2, 1], "0a 1b 1c", "0a", False, "1c"),
]


@pytest.mark.parametrize("case,weights,queued,arrival,refused,displaced", SHED, ids=[s[0] for s in SHED])
def test_shed_when_full(case, weights, queued, arrival, refused, displaced) -> None:
    fq = q(*weights, max_queued=3)
    its = items(queued)
    offer_all(fq, its)
    new = items(arrival, t0=10)[0]
    result = fq.offer(new)
    assert result.refused is refused
    if displaced:
        victim = result.displaced
        assert victim is not None and f"{victim.klass}{victim.tenant}" == displaced
        same = [i for i in its if f"{i.klass}{i.tenant}" == displaced]
        assert victim is same[-1], "the newest of its flow goes"
        assert not victim.queued and new.queued
    else:
        assert result.displaced is None
    assert fq.size == 3
    if not refused:  # the victim is never dispatched
        assert result.displaced not in fq.dispatch(0, 100)


def test_not_full_nothing_is_shed() -> None:
    fq = q(1, max_queued=4)
    offer_all(fq, items("0a 0a 0a"))
    assert fq.offer(Item("a", 0, 5.0)).displaced is None


def test_expire_takes_the_requests_that_waited_max_wait_in_arrival_order() -> None:
    fq = q(1, 1, max_wait_s=5.0)
    its = items("0a 1b 0c 1d")  # arrive at 0, 1, 2, 3
    offer_all(fq, its)
    assert fq.next_expiry() == 5.0
    assert fq.expire(4.99) == []
    assert fq.expire(5.0) == [its[0]]
    assert fq.withdraw(its[1]) and not fq.withdraw(its[1])  # the client of b left; only once
    assert fq.next_expiry() == 7.0
    assert fq.expire(100.0) == its[2:]
    assert fq.size == 0 and fq.next_expiry() is None and fq.dispatch(0, 10) == []


def test_withdrawn_and_dispatched_requests_do_not_expire() -> None:
    fq = q(1, max_wait_s=1.0)
    its = items("0a 0b 0c")
    offer_all(fq, its)
    fq.dispatch(0, 1)
    fq.withdraw(its[1])
    assert fq.expire(10.0) == [its[2]]


@pytest.mark.parametrize("capacity,classes,expected", [
    (1, 2, 0), (2, 2, 1), (3, 2, 1), (10, 1, 0), (10, 2, 2), (19, 2, 4), (32, 2, 8), (100, 3, 25), (0, 2, 0),
])
def test_headroom(capacity, classes, expected) -> None:
    assert headroom(capacity, classes) == expected


@pytest.mark.parametrize("queued,capacity,service,max_wait,expected", [
    (0, 10, 2.0, 30, 1),      # nothing ahead: at least a second
    (100, 10, 2.0, 30, 20),   # 10 rounds of 2 s
    (1000, 10, 2.0, 30, 30),  # never beyond maxQueueSeconds
    (5, 0, 1.0, 0.5, 1),      # no capacity known, sub-second bound: still a whole second
    (7, 2, 0.5, 30, 2),       # 1.75 s rounded up
])
def test_retry_after(queued, capacity, service, max_wait, expected) -> None:
    assert retry_after_s(queued, capacity, service, max_wait) == expected


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weights"):
        FlowQueue([1, 0], 10, 1.0)


# ---- issue 31: fairness by cost, memory O(queued), no scan of the tenants ---------------------------

# (case, weights, arrivals as class+tenant:cost, capacity, dispatched in order)
COST = [
    ("equal costs: round robin as before", [1], "0a:1 0a:1 0b:1 0b:1", 4, "0a 0b 0a 0b"),
    ("a tenant asking 4x per request gets a quarter of the dispatches",
     [1], "0a:4 0a:4 0a:4 0b:1 0b:1 0b:1 0b:1 0b:1 0b:1 0b:1 0b:1", 7, "0a 0b 0b 0b 0b 0a 0b"),
    ("classes share cost by weight 2:1", [2, 1], "0a:2 0a:2 0a:2 1b:1 1b:1 1b:1", 100, "0a 1b 0a 1b 0a 1b"),
]


@pytest.mark.parametrize("case,weights,arrivals,capacity,expected", COST, ids=[c[0] for c in COST])
def test_dispatch_is_fair_by_cost(case, weights, arrivals, capacity, expected) -> None:
    fq = q(*weights)
    for i, w in enumerate(arrivals.split()):
        head, cost = w.split(":")
        assert not fq.offer(Item(head[1:], int(head[0]), float(i), cost=float(cost))).refused
    assert names(fq.dispatch(0, capacity)) == expected


def test_equal_rate_tenants_of_unequal_cost_get_equal_work() -> None:
    fq = q(1, max_queued=1000)
    t = 0.0
    for _ in range(400):  # both backlogged, same request rate; b asks 4x the tokens
        for tenant, cost in (("a", 100.0), ("b", 400.0)):
            fq.offer(Item(tenant, 0, t, cost=cost))
            t += 1
    work = {"a": 0.0, "b": 0.0}
    for it in fq.dispatch(0, 300):
        work[it.tenant] += it.cost
    assert abs(work["a"] - work["b"]) <= 400, work  # within one request of equal


def test_cost_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cost"):
        q(1).offer(Item("a", 0, 0.0, cost=0.0))


def test_memory_stays_with_the_queue_whatever_passes_through() -> None:
    """100,000 requests pass through (queued, dispatched) while one low-class request waits behind the
    headroom: the queue's structures hold a few entries, not one per request that passed."""
    fq = q(1, 1, max_queued=1000, max_wait_s=3600)
    waiting = Item("slow", 1, 0.0)
    fq.offer(waiting)
    for n in range(100_000):
        fq.offer(Item(f"t{n % 50}", 0, 1.0 + n * 1e-4))
        assert fq.dispatch(3, 4)[0].klass == 0  # the top class takes the last slot; the low one may not
    assert fq.size == 1 and waiting.queued
    assert fq.entries() <= 2 * fq.max_queued, fq.entries()
    # control: the measure sees what is queued (it would see a leak of departed requests the same way)
    for n in range(900):
        fq.offer(Item(f"u{n}", 1, 20.0))
    assert fq.entries() >= 900 * 2


def _reference_victim(fq: FlowQueue, item: Item) -> Item | None:
    """The displacement rule by brute force over every flow (the rule the heaps must give)."""
    lowest = max(i for i, c in enumerate(fq.classes) if c.size)
    if lowest < item.klass:
        return None
    flows = {t: list(f.items) for t, f in fq.classes[lowest].flows.items()}
    candidates = [t for t in flows if not (lowest == item.klass and t == item.tenant)]
    if not candidates:
        return None
    longest = max(candidates, key=lambda t: (len(flows[t]), flows[t][-1].seq))
    if lowest == item.klass and len(flows[longest]) <= len(flows.get(item.tenant, ())) + 1:
        return None
    return flows[longest][-1]


@pytest.mark.parametrize("tenants", [3, 12, 60])
def test_displacement_and_expiry_match_a_brute_force_reference_over_random_traffic(tenants) -> None:
    import random

    rng = random.Random(tenants)
    fq = q(3, 1, max_queued=40, max_wait_s=50.0)
    live: list[Item] = []
    t = 0.0
    for _ in range(20_000):
        t += rng.random()
        op = rng.random()
        if op < 0.6:
            it = Item(f"t{rng.randrange(tenants)}", rng.randrange(2), t, cost=rng.choice((1.0, 3.0)))
            expected = _reference_victim(fq, it) if fq.size >= fq.max_queued else None
            got = fq.offer(it)
            assert got.displaced is expected
            assert got.refused == (fq.size >= fq.max_queued and expected is None and not it.queued)
            if it.queued:
                live.append(it)
        elif op < 0.8:
            fq.dispatch(rng.randrange(4), 4)
        elif op < 0.9 and live:
            fq.withdraw(rng.choice(live))
        else:
            for it in fq.expire(t):
                assert t - it.arrived >= fq.max_wait_s
        live = [i for i in live if i.queued]
        assert fq.size == len(live) <= fq.max_queued
        oldest = min((i.arrived for i in live), default=None)
        assert fq.next_expiry() == (None if oldest is None else oldest + fq.max_wait_s)
    assert fq.entries() <= 5 * fq.max_queued + 4 * 64


# Waiting for decode (issue 38): admitted requests whose prefill is over, given decode's slots as they
# free. (case, weights, waiting, in_decode, capacity, given a slot in order)
DECODE_WAIT = [
    ("decode full: nobody", [1], "0a 0b", 8, 8, ""),
    ("decode over its capacity (it shrank): nobody", [1], "0a", 9, 8, ""),
    ("one slot free: the oldest", [1], "0a 0a 0a", 7, 8, "0a"),
    ("free slots bound how many go", [1], "0a 0b 0c 0d", 6, 8, "0a 0b"),
    ("tenants round robin, FIFO within each", [1], "0a 0a 0a 0b", 0, 8, "0a 0b 0a 0a"),
    ("the top class goes first", [8, 1], "1a 1b 0c", 7, 8, "0c"),
    ("then the lower class", [8, 1], "1a 1b 0c", 6, 8, "0c 1a"),
    ("weights share the slots", [3, 1], "1x 1x 1x 0y 0y 0y 0y 0y 0y", 0, 8, "0y 1x 0y 0y 0y 1x 0y 0y"),
    # the headroom was kept at admission: lower classes alone fill decode (admission would stop at 6 of 8)
    ("no headroom: a lower class alone fills decode", [8, 1], "1a 1a 1a 1a", 4, 8, "1a 1a 1a 1a"),
]


@pytest.mark.parametrize("case,weights,waiting,in_decode,capacity,expected", DECODE_WAIT,
                         ids=[d[0] for d in DECODE_WAIT])
def test_decode_slots_go_in_class_order_then_by_tenant(case, weights, waiting, in_decode, capacity,
                                                        expected) -> None:
    dq = decode_queue(weights, 30.0)
    offer_all(dq, items(waiting))
    out = dq.dispatch(in_decode, capacity, spare=0)
    assert names(out) == expected
    assert dq.size == len(waiting.split()) - len(out)


def test_the_admission_queue_keeps_the_headroom_the_decode_wait_does_not() -> None:
    """The negative control of the last row above: the same lower-class requests, dispatched with the
    admission's headroom, leave a quarter of the slots free."""
    fq = q(8, 1)
    offer_all(fq, items("1a 1a 1a 1a"))
    assert names(fq.dispatch(4, 8)) == "1a 1a"


def test_the_decode_wait_is_never_full_and_only_expires() -> None:
    """Everyone in it was admitted (the admission queue bounds them): nobody is refused or displaced."""
    dq = decode_queue([8, 1], 5.0)
    its = items(" ".join(["1a"] * 3000 + ["0b"]))
    offer_all(dq, its)
    assert dq.size == 3001
    assert [i.arrived for i in dq.expire(10.0)] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # waited 5 s or more at t=10
    assert dq.size == 3001 - 6

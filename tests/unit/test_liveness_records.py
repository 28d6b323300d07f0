"""Liveness records hold many sets (`records.liveness_records`), within a size bound, and every consumer reads
both that form and the one-set form of earlier versions (`records.liveness_sets`)."""

from __future__ import annotations

import json

from electra.streaming import records


def _set(name: str, pad: int = 0) -> str:
    return json.dumps({"clusterName": "c", "brokerName": name, "ts": 1, "brokers": [], "pad": "x" * pad})


def test_sets_are_grouped_in_order_within_the_bound_and_read_back_whole():
    texts = [_set(f"s{i}", pad=i % 7 * 50) for i in range(500)]
    out = records.liveness_records(texts, max_bytes=4096)
    assert len(out) > 1
    assert all(len(r) <= 4096 + len(b'{"sets":[]}') for r in out)
    back = [s for r in out for s in records.liveness_sets(records.decode(r))]
    assert back == [json.loads(t) for t in texts]


def test_one_record_when_they_fit_and_none_for_no_sets():
    assert len(records.liveness_records([_set("a"), _set("b")])) == 1
    assert records.liveness_records([]) == []


def test_a_set_bigger_than_the_bound_gets_a_record_of_its_own():
    out = records.liveness_records([_set("a"), _set("big", pad=10_000), _set("b")], max_bytes=1000)
    assert [[s["brokerName"] for s in records.liveness_sets(records.decode(r))] for r in out] == \
        [["a"], ["big"], ["b"]]


def test_the_one_set_form_and_garbage():
    one = json.loads(_set("a"))
    assert records.liveness_sets(one) == [one]
    assert records.liveness_sets([1, 2]) == []
    assert records.liveness_sets("x") == []
    assert records.liveness_sets({"sets": [one, 3]}) == [one]

"""`bench stream`'s fleet beats at spread instants of the interval (`heartbeat_load.phase_slices`)."""

from __future__ import annotations

from electra.bench.heartbeat_load import phase_slices


def test_every_broker_beats_once_an_interval_and_a_sets_brokers_at_different_instants():
    for per_set, phases in ((3, 10), (5, 10), (2, 4), (3, 3), (4, 2)):
        brokers = [(f"set-{i}", b) for i in range(40) for b in range(1, per_set + 1)]
        slices = phase_slices(brokers, phases, per_set)
        assert len(slices) == phases
        assert sorted(x for s in slices for x in s) == sorted(brokers)  # each exactly once
        for s in slices:  # no two brokers of a set at one instant, while there are instants enough
            assert len({name for name, _ in s}) == len(s) or per_set > phases
        masters = {k for k, s in enumerate(slices) for _, b in s if b == 1}
        assert masters == set(range(phases))  # killed masters fall silent at every phase (5 brokers too)
    brokers = [(f"set-{i}", b) for i in range(7) for b in (1, 2, 3)]
    assert phase_slices(brokers, 1, 3) == [brokers]  # one phase: every broker at once (the generator before)

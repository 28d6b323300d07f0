"""`bench stream`'s fleet beats at spread instants of the interval (`heartbeat_load.phase_slices`)."""

from __future__ import annotations

from electra.bench.heartbeat_load import phase_slices


def test_every_broker_beats_once_an_interval_and_a_sets_brokers_at_different_instants():
    brokers = [(f"set-{i}", b) for i in range(7) for b in (1, 2, 3)]
    slices = phase_slices(brokers, 10)
    assert len(slices) == 10
    assert sorted(x for s in slices for x in s) == sorted(brokers)  # each exactly once
    for s in slices:
        assert len({name for name, _ in s}) == len(s)  # no two brokers of a set at one instant
    masters = {k for k, s in enumerate(slices) for _, b in s if b == 1}
    assert len(masters) >= 5  # killed masters fall silent at several phases, not one
    assert phase_slices(brokers, 1) == [brokers]  # one phase: every broker at once (the generator before)

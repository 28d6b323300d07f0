"""The test-only monotonic clock rate (`electra chaos`'s clock-rate fault): bends, never steps."""

from __future__ import annotations

from electra.consensus import runtime
from electra.consensus.runtime import RatedClock


def test_the_clock_runs_at_the_rate_in_its_file_and_stays_monotonic(tmp_path, monkeypatch):
    real = [100.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: real[0])
    rate = tmp_path / "rate"
    rate.write_text("1.0\n")
    clock = RatedClock(str(rate))
    start = clock.now()
    real[0] += 1.0
    assert clock.now() - start == 1.0
    rate.write_text("0.5\n")
    real[0] += 0.1  # the file is read at most every 50 ms
    at_change = clock.now()
    real[0] += 2.0
    assert clock.now() - at_change == 1.0  # two real seconds at half speed
    rate.write_text("2\n")
    real[0] += 0.1
    before = clock.now()
    assert before >= at_change + 1.0  # no step back when the rate rises
    real[0] += 1.0
    assert clock.now() - before == 2.0


def test_an_unreadable_rate_keeps_the_last_one(tmp_path, monkeypatch):
    real = [5.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: real[0])
    rate = tmp_path / "rate"
    rate.write_text("0.9")
    clock = RatedClock(str(rate))
    rate.write_text("garbage")
    t = clock.now()
    real[0] += 1.0
    assert abs(clock.now() - t - 0.9) < 1e-9
    rate.unlink()
    real[0] += 1.0
    assert abs(clock.now() - t - 1.8) < 1e-9

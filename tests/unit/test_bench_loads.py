"""Benchmark load loops and result figures, without servers: fake fleets and clients, recorded samples."""

from __future__ import annotations

import asyncio

import pytest


class _FakeClient:
    def __init__(self) -> None:
        self.registered: list[tuple[str, int, str]] = []
        self.heartbeats: list[str] = []

    async def register(self, cluster, name, broker_id, addr) -> dict:
        self.registered.append((name, broker_id, addr))
        await asyncio.sleep(0.001)
        return {"code": 0}

    async def heartbeat(self, cluster, name, broker_id, addr, **extra) -> dict:
        self.heartbeats.append(addr)
        return {"code": 0}

    async def replica_info(self, name) -> dict:
        await asyncio.sleep(0.001)
        return {"code": 0}

    async def next_broker_id(self, cluster, name) -> dict:
        return {"code": 0}


class _FakeFleet:
    """BrokerFleet's surface `bench controller` uses; `hold_start` makes start() wait to be cancelled."""

    instances: list[_FakeFleet] = []
    hold_start = False

    def __init__(self, endpoints, groups, replicas, **kw) -> None:
        from electra.broker_simulator import SimBroker

        self.client = _FakeClient()
        self.brokers = [SimBroker("bench", f"bench-set-{g}", r, f"10.0.{g}.{r + 1}:10911", broker_id=r + 1)
                        for g in range(groups) for r in range(replicas)]
        self._tasks: list[asyncio.Task] = []
        self.stopped = False
        _FakeFleet.instances.append(self)

    async def start(self, progress: bool = False) -> None:
        if _FakeFleet.hold_start:
            await asyncio.sleep(3600)

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fake_fleet(monkeypatch):
    import electra.broker_simulator

    _FakeFleet.instances, _FakeFleet.hold_start = [], False
    monkeypatch.setattr(electra.broker_simulator, "BrokerFleet", _FakeFleet)
    return _FakeFleet


def test_bench_controller_writes_change_the_address_every_time(fake_fleet):
    """Since RegisterBroker with an unchanged address is answered by a read (no log entry), re-registering the
    fleet's own address measured reads as `write_per_s`: every register must name a new address, and the
    broker's heartbeats the address it registered last."""
    from electra.bench.controller import _load

    out = asyncio.run(_load(["127.0.0.1:1"], 6, 0.2))
    fleet = fake_fleet.instances[0]
    assert len(out["lat"]["register"]) == len(fleet.client.registered) > 2 * len(fleet.brokers)
    first = {(b.name, b.broker_id): f"10.0.{b.name[-1]}.{b.broker_id}:10911" for b in fleet.brokers}
    last = dict(first)
    for name, bid, addr in fleet.client.registered:
        assert addr != last[(name, bid)], f"{name}/{bid} registered {addr} twice in a row: a read, not a write"
        last[(name, bid)] = addr
    assert set(fleet.client.heartbeats) <= {a for _, _, a in fleet.client.registered} | set(first.values())
    assert fake_fleet.instances[0].stopped


def test_an_interrupted_bench_controller_stops_its_fleet(fake_fleet):
    """An interrupt cancels the load (asyncio.run cancels what is left): the fleet is stopped all the same, so its
    HTTP session is closed; it was left open and aiohttp dumped 'Unclosed connector' after `interrupted`."""
    from electra.bench.controller import _load

    fake_fleet.hold_start = True

    async def interrupted() -> None:
        task = asyncio.create_task(_load(["127.0.0.1:1"], 3, 60))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupted())
    assert fake_fleet.instances[0].stopped


def test_bench_tier_reports_an_events_table_it_cannot_read_in_one_line(tmp_path, capsys):
    """The end of `bench tier` read the events table bare: a tier with nothing uploaded ended the run on a
    TableNotFoundError traceback and no RESULT line. Now one `error:` line, and the run goes on to its figures."""
    from electra.bench.tier import _events_table

    assert _events_table(str(tmp_path / "tier")) == (None, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot read the events table under {tmp_path / 'tier'}: ")


def test_bench_tier_lag_figures_are_nan_with_a_reason_from_too_few_samples(capsys):
    """A short run gave `upload_lag_p99_entries=None upload_lag_p99_s=None lag_samples=0`, unexplained."""
    from electra.bench.common import result_line
    from electra.bench.tier import MIN_LAG_SAMPLES, lag_figures

    entries, seconds = lag_figures([(5.0, 0.5)] * (MIN_LAG_SAMPLES - 1), 1.0)
    assert "upload_lag_p99_entries=nan upload_lag_p99_s=nan" in result_line(upload_lag_p99_entries=entries,
                                                                              upload_lag_p99_s=seconds)
    assert f"{MIN_LAG_SAMPLES - 1} lag samples in a 1 s run" in capsys.readouterr().err
    samples = [(float(i), i / 100) for i in range(100)]
    assert lag_figures(samples, 10.0) == (98, 0.98)
    assert capsys.readouterr().err == ""


def test_bench_tier_samples_the_leader_over_one_kept_alive_connection():
    """A new HTTPS connection per sample, after asking the followers first, took ~200 ms a sample on the loaded
    machine (15 samples in 3 s at a 100 ms period): one connection per node now, the leader asked first."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from electra.bench import tier
    from electra.security.credentials import ClientCredentials

    seen: dict[int, dict[str, int]] = {}

    def server(uploading: int) -> ThreadingHTTPServer:
        class Metrics(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                seen[self.server.server_port]["connections"] += 1

            def do_GET(self) -> None:
                seen[self.server.server_port]["requests"] += 1
                body = (f"electra_tier_uploading {uploading}\nelectra_tier_upload_lag_entries 7\n"
                        "electra_tier_upload_lag_seconds 0.25\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        seen[srv.server_port] = {"connections": 0, "requests": 0}
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    follower, leader = server(0), server(1)

    class Creds:
        def credentials(self, role: str) -> ClientCredentials:
            return ClientCredentials()

    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=tier._sample, args=([f"127.0.0.1:{follower.server_port}",
                                                           f"127.0.0.1:{leader.server_port}"], stop, samples, Creds()))
    sampler.start()
    time.sleep(1.0)
    stop.set()
    sampler.join(5)
    for srv in (follower, leader):
        srv.shutdown()
        srv.server_close()
    assert len(samples) >= 8 and samples[0] == (7.0, 0.25)
    assert seen[leader.server_port]["connections"] == 1
    assert seen[follower.server_port]["requests"] == 1  # asked once: the leader is asked first from then on


def _point(brokers: int, per_s: float, p99_ms: float, storm: dict | None = None) -> dict:
    pt = {"brokers": brokers, "capacity": {"per_s": per_s}, "mix": {"controller": {"p99_ms": p99_ms}}}
    return pt | ({"storm": storm} if storm is not None else {})


def test_report_performance_result_has_no_storm_figure_it_did_not_measure():
    """storm_recovery_s was --storm-limit-s (90.000) when the storm did not recover, or did not run at all (a run
    that measured nothing printed it, exit 0): nan now, and why."""
    import math

    from electra.bench.performance_report import _result

    recovered = {"sets": 2, "unrecovered": 0, "recovery_s": 9.62}
    result, why = _result(_point(3, 9000.0, 2.0, recovered), _point(3, 300.0, 7.0), 3, 90.0)
    assert (result["storm_recovery_s"], result["new_vs_old"], why) == (9.6, 30.0, None)

    stuck = {"sets": 2, "unrecovered": 1, "recovery_s": None}
    result, why = _result(_point(3, 9000.0, 2.0, stuck), None, 3, 90.0)
    assert math.isnan(result["storm_recovery_s"]) and math.isnan(result["old_p99_ms"])
    assert why == "1 of 2 sets whose master died had no new master within --storm-limit-s 90 s"

    result, why = _result(None, None, 3, 90.0)
    assert math.isnan(result["storm_recovery_s"]) and why == "no failover storm ran at 3 brokers"
    assert list(result) == ["brokers", "new_per_s", "old_per_s", "new_vs_old", "new_p99_ms", "old_p99_ms",
                            "storm_recovery_s"]


def test_bench_flood_ends_at_its_duration_against_a_server_that_never_answers():
    """Each slowloris and big-body connection waited up to 15 s for an answer, and the heartbeats and reads up to
    httpx's 20 s, the stop time checked only between them: `--duration 3` flooded for 10.9 s. Every wait is
    bounded by the time left now, and one the end cut short is no connection error."""
    import time

    from electra.bench.flood import _flood
    from electra.security.credentials import ClientCredentials

    async def main() -> tuple[float, dict[str, int]]:
        held: list[asyncio.StreamWriter] = []

        async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)
            while await reader.read(1 << 16):
                pass

        server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        counts: dict[str, int] = {}
        t0 = time.monotonic()
        creds = ClientCredentials()
        try:
            await asyncio.wait_for(_flood(f"127.0.0.1:{port}", 1.0, 2, counts, creds, creds), 10)
        finally:
            for w in held:
                w.close()
            server.close()
        return time.monotonic() - t0, counts

    took, counts = asyncio.run(main())
    assert took < 4.0, f"a 1 s flood took {took:.1f} s"
    assert counts.get("conn_errors", 0) == 0, counts


def test_bench_dashboard_per_viewer_cpu_within_the_resolution_is_flagged_and_never_negative():
    """/proc counts CPU in 10 ms steps: `--window 2 --viewers 2` printed cpu_ms_per_s_per_viewer=-5.000."""
    import math

    from electra.bench.dashboard import TICK_MS, per_viewer_cpu

    assert TICK_MS == 10
    value, note = per_viewer_cpu(15.0, 10.0, 2, 2.0)  # the smoke run's figures: -5 within ±10 ms/s
    assert value == 0.0 and "within the measurement's resolution (±10.000" in note and "reported as 0" in note
    value, note = per_viewer_cpu(9.0, 11.0, 50, 10.0)  # docs/dashboard.md's run: 0.04, at its resolution
    assert math.isclose(value, 2 / 49) and "within" in note
    value, note = per_viewer_cpu(9.0, 20.0, 21, 10.0)  # 0.55 ms/s per viewer, resolution 0.1
    assert math.isclose(value, 0.55) and note is None
    value, note = per_viewer_cpu(20.0, 9.0, 21, 10.0)  # fell by more than the resolution: noise
    assert math.isnan(value) and "noise" in note

"""The simulated fleet's traffic to the controller side: what it does when it is refused."""

from __future__ import annotations

import asyncio
import contextlib

from electra.security.credentials import ClientCredentials


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_refused_sync_state_set_is_asked_again_a_poll_period_later_not_every_heartbeat():
    """Before the controllers see the replicas alive, every master's AlterSyncStateSet is refused; asked
    every second, a 1,000-set fleet spent most of its CPU (and the leader's) on those refused writes."""
    from electra.broker_simulator import BrokerFleet
    from electra.state.codes import Code

    class Client:
        def __init__(self) -> None:
            self.calls = 0

        async def alter_sync_state_set(self, *args) -> dict:
            self.calls += 1
            return {"code": Code.CONTROLLER_BROKER_NOT_ALIVE, "header": {}, "body": None}

    async def main():
        fleet = BrokerFleet(["127.0.0.1:1"], 1, 3, poll_s=0.3, credentials=ClientCredentials())
        fleet.client = Client()
        for i, b in enumerate(fleet.by_set["sim-set-0"], 1):
            b.broker_id = i
        master = fleet.by_set["sim-set-0"][0]
        master.role, master.sync_state_set = "master", [1]
        for _ in range(5):
            await fleet._grow_sync_state_set(master)
        assert fleet.client.calls == 1
        await asyncio.sleep(0.35)
        await fleet._grow_sync_state_set(master)
        assert fleet.client.calls == 2
        fleet.reads.close()

    run(main())


def test_a_session_whose_heartbeat_is_refused_for_want_of_kafka_stays_open():
    """503 means Kafka is unavailable behind the worker, not that the connection is bad: resetting it would
    publish connection_lost for a live broker (a false crash failover) and reconnect every session at once."""
    from electra.broker_simulator import BrokerFleet

    class Session:
        is_open = True
        aborted = False

        def abort(self) -> None:
            self.aborted = True

    fleet = BrokerFleet(["127.0.0.1:1"], 1, 1, credentials=ClientCredentials(), ingest_endpoints=["127.0.0.1:2"])
    b = fleet.brokers[0]
    b.session = s = Session()
    fleet._heartbeat_answered(b, s, 503)
    assert b.session is s and not s.aborted and fleet.stats["heartbeats_refused"] == 1
    fleet._heartbeat_answered(b, s, 0)  # the connection failed: reconnect (to the next endpoint)
    assert b.session is None and s.aborted and b.session_skip == 1


def test_a_simulator_whose_controllers_never_answer_ends_at_its_duration_and_says_so(capsys, monkeypatch):
    """Brokers retry registering for ever; a simulator run with `--duration` ends then, and says why."""
    import time

    from electra import broker_simulator

    async def main() -> dict:
        return await broker_simulator.run_simulator(["127.0.0.1:1"], 1, 3, duration_s=1.5)

    t0 = time.monotonic()
    stats = asyncio.run(main())
    assert time.monotonic() - t0 < 10
    assert stats["registered"] is False
    assert "not every broker registered within 1.5s" in capsys.readouterr().out


def test_while_registering_failed_requests_are_reported(capsys, monkeypatch):
    from electra import broker_simulator

    monkeypatch.setattr(broker_simulator, "REGISTER_REPORT_S", 0.2)

    async def main() -> None:
        fleet = broker_simulator.BrokerFleet(["127.0.0.1:1"], 1, 3)

        async def refused(*_args, **_kwargs):
            raise ConnectionRefusedError("cannot connect to 127.0.0.1:1")

        fleet.client.next_broker_id = refused
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fleet.start(progress=True), 1.0)
        await fleet.stop()

    asyncio.run(main())
    out = capsys.readouterr().out
    assert "0/1 sets registered; still trying" in out and "cannot connect to 127.0.0.1:1" in out


def test_a_fleet_whose_credential_is_refused_stops_and_says_why(monkeypatch, capsys):
    """401/403 never turn into a retry (it was `KeyError: 'header'` and a traceback): `electra simulate-brokers`
    prints one line and exits 1."""
    from electra import broker_simulator, cli

    async def refused(*_args, **_kwargs):
        return {"code": 16, "remark": "invalid or revoked token", "httpStatus": 401}

    real = broker_simulator.BrokerFleet

    def fleet_refused(*args, **kwargs):
        fleet = real(*args, **kwargs)
        fleet.client.next_broker_id = refused
        return fleet

    monkeypatch.setattr(broker_simulator, "BrokerFleet", fleet_refused)
    code = cli.main(["simulate-brokers", "--endpoints", "127.0.0.1:1", "--groups", "1", "--duration", "5",
                     "--no-stdin"])
    err = capsys.readouterr().err
    assert code == 1 and "error: the controllers refused this fleet's credential: HTTP 401" in err, err
    assert "Traceback" not in err


def test_an_interrupted_command_says_so_and_exits_130(monkeypatch, capsys):
    from electra import cli

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_status", interrupted)
    assert cli.main(["status", "--endpoints", "127.0.0.1:1"]) == 130
    assert capsys.readouterr().err.strip() == "electra status: interrupted"


def _registered_fleet():
    """Two sets of three brokers, as if registered: ids 1-3, broker 1 the master."""
    from electra.broker_simulator import BrokerFleet

    fleet = BrokerFleet(["127.0.0.1:1"], 2, 3, credentials=ClientCredentials())
    for b in fleet.brokers:
        b.broker_id = b.slot + 1
        b.role = "master" if b.slot == 0 else "slave"
    return fleet


def test_fleet_commands_answer_bad_input_with_usage_and_revive_only_what_is_down(capsys):
    """QA: `kill sim-set-0` said `list index out of range`, an unknown set a bare `'nosuch'`, and `revive`
    of a live master demoted it (the set then had no live master)."""
    from electra.broker_simulator import _command

    async def main():
        fleet = _registered_fleet()
        try:
            for line in ("kill sim-set-0", "kill sim-set-0 abc", "kill nosuch 1", "hang-master nosuch",
                         "bogus", "kill sim-set-0 9", "revive sim-set-0 1", "list", "list sim-set-1"):
                assert _command(fleet, line) is False
            out = capsys.readouterr().out.splitlines()
            assert out[0] == out[1] == "usage: kill SET ID (ID: a broker id, see `list SET`)"
            assert out[2].startswith("unknown broker set 'nosuch' (this fleet's sets: sim-set-0, sim-set-1")
            assert out[3].startswith("unknown broker set 'nosuch'")
            assert out[4].startswith("unknown command 'bogus'; commands: kill SET ID | hang SET ID")
            assert out[5] == "no broker 9 in sim-set-0"
            assert out[6] == "broker 1 of sim-set-0 is neither killed nor hung: nothing to revive"
            assert fleet.master_of("sim-set-0") is not None  # still the master
            assert out[7] == "sets: sim-set-0 sim-set-1"
            assert out[8] == "sim-set-1: 1 10.0.1.1:10911 master, 2 10.0.1.2:10911 slave, 3 10.0.1.3:10911 slave"
            assert _command(fleet, "hang sim-set-1 2") is False and _command(fleet, "revive sim-set-1 2") is False
            assert capsys.readouterr().out.splitlines() == ["hung 10.0.1.2:10911", "revived 10.0.1.2:10911"]
            assert _command(fleet, "quit") is True
        finally:
            await fleet.stop()

    run(main())


def test_quit_and_status_work_while_registering_and_duration_ends_a_run_whose_stdin_stays_open(capsys):
    """QA: with no controller answering the fleet printed nothing and ignored `status` and `quit`; and with
    stdin open, `--duration` was only looked at after a line arrived."""
    import time

    from electra.broker_simulator import run_simulator

    async def script(lines):
        for line in lines:
            yield line
        await asyncio.sleep(3600)  # an open terminal: nothing more, no EOF

    t0 = time.monotonic()
    stats = run(run_simulator(["127.0.0.1:1"], 1, 3, duration_s=60, commands=script(["status\n", "quit\n"])))
    assert stats["quit"] and not stats["registered"] and time.monotonic() - t0 < 10
    assert capsys.readouterr().out.startswith("registering: 0/1 sets; requests")
    t0 = time.monotonic()
    stats = run(run_simulator(["127.0.0.1:1"], 1, 3, duration_s=1.5, commands=script(["kill sim-set-0 1\n"])))
    assert not stats["quit"] and not stats["registered"] and time.monotonic() - t0 < 10
    assert "not every broker registered within 1.5s" in capsys.readouterr().out


def test_ctrl_c_stops_the_simulator_while_stdin_is_idle():
    """QA: stdin was read in the loop's executor, which the loop joins at shutdown: SIGINT waited for a line."""
    import signal
    import subprocess
    import sys
    import time

    sim = subprocess.Popen([sys.executable, "-m", "electra.cli", "simulate-brokers", "--endpoints", "127.0.0.1:1",
                            "--groups", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # imported and registering (nothing answers)
        sim.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        sim.wait(timeout=15)  # stdin stays open (communicate() would close it: an EOF ends the read)
        assert sim.returncode == 130 and time.monotonic() - t0 < 5, (sim.returncode, sim.stderr.read()[-2000:])
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()


def test_help_lists_the_commands_and_a_second_kill_or_hang_says_it_changed_nothing(capsys):
    """Probe: `help` (the word an operator tries first) was an 'unknown command', and `kill SET ID` of a broker
    already killed (or `hang` of one already hung) answered `killed ...`/`hung ...` again as if it had acted."""
    from electra.broker_simulator import COMMANDS, _command

    async def main():
        fleet = _registered_fleet()
        try:
            for line in ("help", "kill sim-set-0 2", "kill sim-set-0 2", "hang sim-set-0 2", "hang sim-set-1 3",
                         "hang sim-set-1 3", "kill sim-set-1 3"):
                assert _command(fleet, line) is False
            assert capsys.readouterr().out.splitlines() == [
                f"commands: {COMMANDS}", "killed 10.0.0.2:10911",
                "broker 2 of sim-set-0 is killed already (`revive sim-set-0 2`)",
                "broker 2 of sim-set-0 is killed already (`revive sim-set-0 2`)",
                "hung 10.0.1.3:10911", "broker 3 of sim-set-1 is hung already (`revive sim-set-1 3`)",
                "killed 10.0.1.3:10911"]  # a hung broker may still be killed
            assert "| help |" in COMMANDS
        finally:
            await fleet.stop()

    run(main())


def test_help_answers_while_the_fleet_registers(capsys):
    """Probe: `help` before registration was queued and then called an unknown command."""
    import time

    from electra.broker_simulator import COMMANDS, run_simulator

    async def script(lines):
        for line in lines:
            yield line
        await asyncio.sleep(3600)

    t0 = time.monotonic()
    stats = run(run_simulator(["127.0.0.1:1"], 1, 3, duration_s=60, commands=script(["help\n", "quit\n"])))
    assert stats["quit"] and time.monotonic() - t0 < 10
    assert capsys.readouterr().out.startswith(f"commands: {COMMANDS} (all but status and quit wait")



def test_a_fleet_without_stdin_does_not_offer_commands(capsys, monkeypatch):
    """Probe: `electra up --demo` off a terminal said 'demo commands are off', and the next line, the fleet's, listed
    the commands to type."""
    from electra.broker_simulator import BrokerFleet, run_simulator

    async def registered(self, progress=False):
        return None

    monkeypatch.setattr(BrokerFleet, "start", registered)
    run(run_simulator(["127.0.0.1:1"], 1, 3, duration_s=0.5, commands=None))
    out = capsys.readouterr().out
    assert "broker sets x 3 replicas registered in" in out and "commands:" not in out, out

"""Numbers on every command line are checked where they are parsed (electra/cli_args.py)."""

from __future__ import annotations

import re

import pytest

from electra.cli import build_parser
from electra.cli_args import Parser


def _error(capsys, parser, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_numbers_below_their_minimum_are_refused_with_the_option_named(capsys):
    p = Parser(prog="t")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--episodes", type=int, default=30, minimum=1)
    p.add_argument("--offset-ms", type=int, default=0, minimum=None)
    assert p.parse_args(["--duration", "0", "--episodes", "1", "--offset-ms", "-5"]).offset_ms == -5
    assert "argument --duration: must be at least 0, got -1" in _error(capsys, p, ["--duration", "-1"])
    assert "argument --episodes: must be at least 1, got 0" in _error(capsys, p, ["--episodes", "0"])
    assert "must be a finite number" in _error(capsys, p, ["--duration", "inf"])
    assert "invalid int value: 'x'" in _error(capsys, p, ["--episodes", "x"])


def test_the_electra_commands_use_it_down_to_their_subcommands(capsys):
    cli = build_parser()
    assert "argument --episodes: must be at least 1" in _error(capsys, cli, ["chaos", "--episodes", "-3"])
    assert "argument --seeds: must be at least 1" in _error(capsys, cli, ["sim", "--seeds", "-5"])
    assert "argument --settle-ms: must be at least 500, got 0" in _error(capsys, cli, ["sim", "--settle-ms", "0"])
    assert "argument --first-episode: must be at least 0" in _error(capsys, cli, ["chaos", "--first-episode", "-1"])
    shard = cli.parse_args(["chaos", "--long", "--first-episode", "500", "--episodes", "500"])
    assert (shard.first_episode, shard.episodes) == (500, 500)


def test_a_benchmark_refuses_a_negative_duration(capsys):
    from bench import api

    with pytest.raises(SystemExit) as exc:
        api.main(["--duration", "-1"])
    assert exc.value.code == 2
    assert "argument --duration: must be at least 1, got -1" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "failover", "--groups", "abc"], "argument --groups: expected counts like 10,100,1000, got 'abc'"),
    (["bench", "failover", "--groups", "100,-5"], "argument --groups: every count must be from 1 to 64000, got 100,-5"),
    (["bench", "failover", "--groups", "1,,2"], "argument --groups: expected counts like 10,100,1000 (no empty item)"),
    (["bench", "failover", "--groups", "99999999999999999999"], "every count must be from 1 to 64000"),
    (["bench", "stream", "--sets", "100001"], "argument --sets: must be at most 100000, got 100001"),
    (["bench", "failover", "--groups", ","], "argument --groups: expected at least one count"),
    (["bench", "failover", "--timeout-ms", "0"], "argument --timeout-ms: must be at least 1, got 0"),
    (["bench", "stream", "--sets", "0"], "argument --sets: must be at least 1, got 0"),
    (["bench", "dashboard", "--viewers", "1"], "argument --viewers: must be at least 2, got 1"),  # nan per viewer
    (["bench", "dashboard", "--window", "2"], "argument --window: must be at least 5, got 2"),  # 10 ms CPU steps
    (["bench", "reads", "--entries", "10"], "argument --entries: must be at least 1000, got 10"),
    (["bench", "api", "--front-ends", "0,17"], "argument --front-ends: every count must be from 0 to 16, got 0,17"),
    (["report", "performance", "--brokers", "2,10"], "--brokers: every count must be from 3 to 200000, got 2,10"),
    (["up", "--http-port", "70000"], "argument --http-port: must be at most 65535, got 70000"),
    (["simulate-brokers", "--groups", "0"], "argument --groups: must be at least 1, got 0"),
    (["ingest", "--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["simulate-brokers", "--groups", "64001"], "argument --groups: must be at most 64000, got 64001"),
    (["sim", "--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    (["node", "--id", "-1", "--peers", "1=127.0.0.1:1", "--data-dir", "x"], "id must be from 1 to 2147483647, not -1"),
    (["node", "--id", "0", "--peers", "1=127.0.0.1:1", "--data-dir", "x"], "id must be from 1 to 2147483647, not 0"),
    (["sim", "--seeds", "99999999999999"], "argument --seeds: must be at most 100000000, got 99999999999999"),
    (["sim", "--start", "-1"], "argument --start: must be at least 0, got -1"),
    (["bench", "tier", "--tier-uri", "/proc/nonexistent/x"], "argument --tier-uri: /proc/nonexistent/x: cannot "
     "write the tier there"),  # the nodes logged a traceback per retry, then the reader's TableNotFoundError
    (["bench", "tier", "--tier-uri", ""], "argument --tier-uri: empty: omit --tier-uri"),  # was a temp dir
    (["bench", "tier", "--tier-uri", "ftp://host/x"], "argument --tier-uri: unsupported scheme ftp://"),
    (["report", "performance", "--legacy-max-brokers", "0"],
     "argument --legacy-max-brokers: must be at least 3, got 0"),
    (["report", "performance", "--architectures", "legacy", "--legacy-max-brokers", "3", "--brokers", "10",
      "--etcd", "off"], "no point of --brokers 10 would run"),  # it printed a RESULT of nothing, exit 0
    (["report", "performance", "--brokers", "10", "--out", "/proc/no-such-dir/x"],
     "--out /proc/no-such-dir/x: cannot write the report there"),  # checked before minutes of measuring
])
def test_meaningless_sizes_are_refused_before_anything_starts(capsys, argv, message):
    """Each of these used to start processes (Kafka, nodes) and then fail with a traceback, or run
    a benchmark of nothing; now argparse refuses them (exit 2) with the option named."""
    from electra import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_count_list_is_sorted_without_repeats():
    from electra.cli_args import count_list

    assert count_list(1)("1000, 100,100,300") == [100, 300, 1000]


@pytest.mark.parametrize(("argv", "match"), [
    (["--faults", "kill,bogus"], "unknown fault kind 'bogus'"),
    (["--faults", "kill:nobody"], "fault 'kill' has no mode 'nobody'"),
    (["--pipeline", "--faults", "spark-kill,bogus2"], "known with --pipeline: kafka-restart, spark-kill"),
    # QA: a list naming no kind ran into "no fault kind can be injected here", exit 1, as if the machine lacked them
    (["--faults", ","], "error: --faults ',' names no fault kind; known: kill, pause"),
    (["--pipeline", "--faults", " , "], "error: --faults ' , ' names no fault kind"),
])
def test_chaos_refuses_an_unknown_fault_before_starting_anything(argv, match, capsys):
    args = build_parser().parse_args(["chaos", *argv])
    with pytest.raises(SystemExit) as exit_:
        args.fn(args)
    assert exit_.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("endpoints", ["nonsense", "127.0.0.1:99999", "127.0.0.1:x", ":7301", "127.0.0.1:0",
                                       "http://127.0.0.1:7301", "::1:7301", "a,,b"])
def test_admin_and_status_refuse_a_bad_endpoint_before_connecting(endpoints, capsys):
    for argv in (["admin", "--endpoints", endpoints, "replica-info", "s1"], ["status", "--endpoints", endpoints]):
        args = build_parser().parse_args(argv)
        with pytest.raises(SystemExit) as exit_:
            args.fn(args)
        assert exit_.value.code == 2 and "error: --endpoints: bad address" in capsys.readouterr().err


def test_a_count_list_can_keep_the_order_given():
    from electra.cli_args import count_list

    assert count_list(0, 16, sort=False)("1,0,1") == [1, 0]


def test_up_refuses_a_first_port_whose_nodes_would_pass_65535(capsys):
    from electra import cli

    assert cli.main(["up", "--nodes", "3", "--http-port", "65534"]) == 2
    assert "--http-port 65534: 3 nodes need ports up to 65536, past 65535" in capsys.readouterr().err


def test_ingest_names_a_bad_node_id_from_the_environment_and_does_not_start(capsys, monkeypatch):
    """`ELECTRA_NODE_ID` (a systemd unit sets it) is `--node-id`'s default: a bad one is refused naming both, not
    only the option the user never typed."""
    monkeypatch.setenv("ELECTRA_NODE_ID", "abc")
    err = _error(capsys, build_parser(), ["ingest", "--kafka-bootstrap", "127.0.0.1:1", "--insecure"])
    assert "expected a node id, an integer of at least 1 (from --node-id or ELECTRA_NODE_ID), got 'abc'" in err
    monkeypatch.delenv("ELECTRA_NODE_ID")
    assert "got '0'" in _error(capsys, build_parser(), ["ingest", "--kafka-bootstrap", "k:1", "--node-id", "0"])
    assert build_parser().parse_args(["ingest", "--kafka-bootstrap", "k:1", "--node-id", "7"]).node_id == 7


@pytest.mark.parametrize(("argv", "message"), [
    (["--http-port", "7102"], "--raft-port 7101 and --http-port 7102 overlap at port 7102"),
    (["--ingest-port", "7303", "--nodes", "5"], "--http-port 7301 and --ingest-port 7303 overlap at port 7303"),
    (["--kafka-port", "7402"], "--ingest-port 7401 and --kafka-port 7402 overlap at port 7402"),
])
def test_up_refuses_overlapping_port_ranges_before_starting_anything(argv, message, capsys, tmp_path):
    from electra.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["up", "--data-dir", str(tmp_path / "d"), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # nothing started, nothing written


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize(("taken", "what"), [(0, "--raft-port, node 1's Raft"), (1, "--http-port, node 1's HTTP"),
                                             (2, "--ingest-port, node 1's heartbeat ingest"),
                                             (3, "--kafka-port, the embedded Kafka broker")])
def test_up_refuses_a_port_in_use_before_starting_anything(taken, what, monkeypatch, capsys, tmp_path):
    """QA: with the HTTP ports held by another stack, `up` announced that stack's leader while its own nodes
    crash-looped; a held Kafka port ended in tansu's "exit 0" or 20 s of client errors. A port whose
    connections are in TIME_WAIT (a stack just stopped, then restarted on its data dir) is not in use."""
    import socket

    from electra import cli

    started = []
    monkeypatch.setattr(cli, "_run_stack", lambda stack, cfg, args: started.append(cfg) or 0)
    ports = _free_ports(4)
    argv = ["up", "--insecure", "--nodes", "1", "--data-dir", str(tmp_path / "d"),
            *(x for option, port in zip(("--raft-port", "--http-port", "--ingest-port", "--kafka-port"), ports,
                                        strict=True) for x in (option, str(port)))]
    with socket.socket() as other:  # another process's listener (an ingest's: SO_REUSEPORT, refused alike)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as every server of the stack binds
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", ports[taken]))
        other.listen(1)
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and not started
        err = capsys.readouterr().err
        assert f"error: port {ports[taken]} ({what}) is already in use on 127.0.0.1\n" == err, err
        client = socket.create_connection(("127.0.0.1", ports[taken]), timeout=5)
        conn, _ = other.accept()
        conn.close()  # closed first on the listening side: its end of the connection stays in TIME_WAIT
        client.close()
    assert cli.main(argv) == 0 and len(started) == 1
    if taken == 3:  # with an external Kafka, the embedded broker's port is not ours to check
        with socket.create_server(("127.0.0.1", ports[3])):
            assert cli.main([*argv, "--kafka-bootstrap", "kafka:9092"]) == 0


def test_up_refuses_a_data_dir_in_use_before_starting_anything_or_opening_a_log(monkeypatch, capsys, tmp_path):
    """QA: a second `up` on a running stack's data dir started tansu and ingest workers, truncated the running
    kafka.log and wrote to its logs before its nodes refused their data dirs. `up` now holds `<data-dir>/LOCK`
    and checks each node's lock first, leaving that lock to the node it starts."""
    import os

    from electra import cli
    from electra.consensus.data_dir_claims import DataDirInUse, check_data_dir_free, lock_data_dir

    d = tmp_path / "d"
    held_while_running = []

    def fake_run(stack, cfg, args):
        with pytest.raises(DataDirInUse):  # a second `up` is refused while this one runs
            check_data_dir_free(d)
        os.close(lock_data_dir(d / "node1"))  # and the node can take its own lock
        held_while_running.append(True)
        return 0

    monkeypatch.setattr(cli, "_run_stack", fake_run)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)  # a `make run` may hold the default ports
    argv = ["up", "--insecure", "--nodes", "3", "--data-dir", str(d)]
    for held in (d, d / "node2"):  # another `up` on this data dir; a node process still serving its part
        claim = lock_data_dir(held)
        try:
            with pytest.raises(SystemExit) as exc:
                cli.main(argv)
        finally:
            os.close(claim)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"error: data directory {held} is in use by another process (pid " \
            f"{os.getpid()})" in err, err
        assert not (d / "logs").exists() and not held_while_running  # nothing started, no log opened
    assert cli.main(argv) == 0 and held_while_running
    check_data_dir_free(d)  # released when `up` returns
    assert cli.main(argv) == 0  # and a restart on the same data dir runs


def test_up_demo_says_its_commands_are_off_when_stdin_is_not_a_terminal(monkeypatch, capsys, tmp_path):
    """QA: with stdin not a terminal the simulator ran with --no-stdin, yet the banner said to type kill-master."""
    import io
    import signal
    from types import SimpleNamespace

    from electra import cli

    async def leader(*args, **kwargs):
        return 1

    def ctrl_c():  # once the stack is up
        raise KeyboardInterrupt

    spawned: dict[str, list[str]] = {}
    stack = SimpleNamespace(start_controllers=lambda: None, raft_peers="1=127.0.0.1:1", logs=tmp_path, creds=None,
                            endpoints={1: "127.0.0.1:1"}, ingest_endpoints={1: "127.0.0.1:2"}, exited=ctrl_c,
                            spawn=lambda name, cmd, **kw: spawned.setdefault(name, cmd), _py=lambda: ["electra"],
                            tier_uri=None, stop_all=lambda: None)
    cfg = SimpleNamespace(legacy=True, nodes=1, ingest_workers=1, data_dir=tmp_path)
    monkeypatch.setattr(cli, "_wait_for_http_leader", leader)
    monkeypatch.setattr(cli.sys, "stdin", io.StringIO())  # a pipe, /dev/null: not a terminal
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:  # `_run_stack` ignores these signals while it stops the stack
        assert cli._run_stack(stack, cfg, SimpleNamespace(no_streaming=True, demo=True, demo_groups=2)) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out = capsys.readouterr().out
    assert "--no-stdin" in spawned["brokers"]
    assert "stdin is not a terminal, so demo commands are off" in out and "type `kill-master" not in out, out


def test_a_node_refuses_a_data_dir_that_is_a_file_and_names_a_file_in_its_layout(tmp_path, capsys):
    from electra.cli import main
    from electra.consensus.files import OsFiles

    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["node", "--insecure", "--id", "1", "--peers", "1=127.0.0.1:1", "--data-dir", str(afile)])
    assert exc.value.code == 2 and f"--data-dir {afile} is not a directory" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "raft-log").write_text("x")
    with pytest.raises(NotADirectoryError, match="raft-log exists and is not a directory"):
        OsFiles().mkdir(tmp_path / "d" / "raft-log")


def test_up_names_processes_that_exited_instead_of_waiting_for_a_leader(tmp_path):
    """Nodes that die at start were waited for 30 s ("no leader within 30s"); tansu's death went unnoticed."""
    import asyncio
    import subprocess
    import time
    from types import SimpleNamespace

    from electra.cli import _wait_for_http_leader
    from electra.local_stack import LocalStack, StackConfig

    stack = LocalStack(StackConfig(data_dir=tmp_path / "d", secure=False))
    stack.kafka = SimpleNamespace(proc=subprocess.Popen(["true"]))
    stack.kafka.proc.wait(timeout=10)
    assert stack.exited() == ["the embedded Kafka broker, tansu (exit 0)"]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no leader: the embedded Kafka broker, tansu .* exited"):
        asyncio.run(_wait_for_http_leader(["127.0.0.1:9"], timeout=30, exited=stack.exited))
    assert time.monotonic() - t0 < 5


def test_up_passes_accept_new_peers_to_every_node(tmp_path, monkeypatch):
    """`electra up --accept-new-peers` resizes a local stack's data dir (each node's member file refuses otherwise)."""
    from electra import cli
    from electra.local_stack import LocalStack

    seen = {}

    def fake_run(stack, cfg, args):
        for i in range(1, cfg.nodes + 1):
            seen[i] = stack.start_node(i)
        return 0

    monkeypatch.setattr(cli, "_run_stack", fake_run)
    monkeypatch.setattr(LocalStack, "spawn", lambda self, name, cmd, **kw: cmd)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)  # a `make run` may hold the default ports
    for flag, expect in ((["--accept-new-peers"], True), ([], False)):
        seen.clear()
        assert cli.main(["up", "--insecure", "--nodes", "3", "--data-dir", str(tmp_path / "d"), *flag]) == 0
        assert len(seen) == 3 and all(("--accept-new-peers" in cmd) == expect for cmd in seen.values()), seen


@pytest.mark.parametrize(("argv", "message"), [
    (["--time-budget-s", "0"], "argument --time-budget-s: must be at least 1, got 0"),  # ran 0 episodes, exit 0
    (["--episode", "5", "--episodes", "2"], "error: --episode replays one episode of --seed: drop --episodes"),
    (["--broker-sets", "3"], "error: --broker-sets apply to --pipeline runs only"),
    (["--out", "/proc/forbidden"], "error: --out /proc/forbidden: cannot create the directory"),
])
def test_chaos_refuses_what_it_would_ignore_before_starting_anything(argv, message, capsys):
    """QA: these ran, or failed with a traceback, instead of saying what was wrong."""
    from electra.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["chaos", "--faults", "kill", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_report_and_bench_answer_a_missing_or_unknown_name_alike(capsys):
    from electra.cli import main

    assert main(["report"]) == 2 and main(["bench"]) == 2  # a bare command is a usage error (report said 0)
    assert main(["report", "--help"]) == 0 and main(["bench", "--help"]) == 0
    capsys.readouterr()
    assert main(["report", "nosuch"]) == 2
    assert "unknown report 'nosuch'; available: performance" in capsys.readouterr().err


def test_ingest_sends_session_records_to_the_nodes_liveness_topic_whatever_form_its_topics_take():
    from electra.cli import ingest_topics

    assert ingest_topics(None, None) == ("electra.heartbeats", "electra.liveness")
    assert ingest_topics(None, "stg.") == ("stg.electra.heartbeats", "stg.electra.liveness")
    # the form deployments used before sessions wrote to the liveness topic: the prefix is --topic's
    assert ingest_topics("stg.electra.heartbeats", None) == ("stg.electra.heartbeats", "stg.electra.liveness")
    assert ingest_topics("hb", "stg.") == ("hb", "stg.electra.liveness")
    with pytest.raises(ValueError, match="give --topic-prefix too"):
        ingest_topics("my-heartbeats", None)  # the liveness topic cannot be guessed from it
    # names Kafka refuses fail at start, not as every heartbeat's error later
    for topic, prefix in ((None, "bad/"), (None, "bad prefix."), ("", "p."), ("x" * 250, "p.")):
        with pytest.raises(ValueError, match="is not a Kafka topic name"):
            ingest_topics(topic, prefix)
    with pytest.raises(ValueError, match="topic of their own"):  # heartbeats into the nodes' liveness topic
        ingest_topics("electra.liveness", "")


def test_ingest_reads_its_topic_prefix_from_the_environment_as_the_nodes_do(monkeypatch):
    from electra.cli import build_parser

    monkeypatch.setenv("ELECTRA_TOPIC_PREFIX", "stg.")
    args = build_parser().parse_args(["ingest", "--kafka-bootstrap", "k:9092"])
    assert args.topic_prefix == "stg."
    monkeypatch.delenv("ELECTRA_TOPIC_PREFIX")
    assert build_parser().parse_args(["ingest", "--kafka-bootstrap", "k:9092"]).topic_prefix is None


def test_up_passes_the_disconnect_grace_to_the_streaming_job_and_refuses_a_negative_one(tmp_path, monkeypatch, capsys):
    """`electra up --disconnect-grace-ms G` (docs/failover-signal.md: the grace period) reaches the job's command line;
    the job itself refuses a negative grace instead of taking it for 0."""
    from electra import cli
    from electra.local_stack import LocalStack
    from electra.streaming import job

    seen = {}

    def fake_run(stack, cfg, args):
        seen["job"] = stack.start_job()
        return 0

    monkeypatch.setattr(cli, "_run_stack", fake_run)
    monkeypatch.setattr(LocalStack, "spawn", lambda self, name, cmd, **kw: cmd)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)  # a `make run` may hold the default ports
    for flag, expect in ((["--disconnect-grace-ms", "1500"], "1500"), ([], None)):
        assert cli.main(["up", "--insecure", "--data-dir", str(tmp_path / "d"), *flag]) == 0
        cmd = seen["job"]
        assert (cmd[cmd.index("--disconnect-grace-ms") + 1] if "--disconnect-grace-ms" in cmd else None) == expect
    with pytest.raises(SystemExit):
        cli.main(["up", "--insecure", "--data-dir", str(tmp_path / "d"), "--disconnect-grace-ms", "-1"])
    assert "--disconnect-grace-ms: must be at least 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        job.parse_args(["--bootstrap", "k:9092", "--controllers", "c:1", "--disconnect-grace-ms", "-5"])
    assert "--disconnect-grace-ms: must be at least 0, got -5" in capsys.readouterr().err


def test_the_read_task_rule_and_the_job_refuses_a_negative_count(capsys):
    """`--read-tasks`' sizing rule (docs/heartbeat-pipeline.md, "Sizing the read"): one task per 10,000
    heartbeats a second, at least one, never more than the job's cores; the job refuses a negative count."""
    from electra.streaming import job
    from electra.streaming.job import read_tasks_for

    assert read_tasks_for(0, 2) == 1
    assert read_tasks_for(3_000, 2) == 1          # 1,000 sets: one task (a second one costs ~100 µs a heartbeat)
    assert read_tasks_for(10_000, 2) == 1
    assert read_tasks_for(10_001, 2) == 2
    assert read_tasks_for(30_000, 2) == 2         # 10,000 sets on local[2]
    assert read_tasks_for(30_000, 8) == 3
    assert read_tasks_for(30_000, 0) == 1
    base = ["--bootstrap", "k:9092", "--controllers", "c:1", "--checkpoint", "/tmp/cp"]
    assert job.parse_args(base).read_tasks == 1
    for args, error in ((["--read-tasks", "-1"], "--read-tasks: must be at least 0, got -1"),
                        (["--trigger-ms", "-1"], "--trigger-ms: must be at least 0, got -1"),
                        (["--proposal-retries", "-2"], "--proposal-retries: must be at least 0, got -2"),
                        (["--conf", "spark.x"], "--conf: KEY=VALUE expected, got 'spark.x'")):
        with pytest.raises(SystemExit):
            job.parse_args(base + args)
        assert error in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "match"), [
    (["ingest", "--insecure", "--kafka-bootstrap", ":"], "bad address ':'"),
    (["up", "--kafka-bootstrap", "kafka:99999"], "port 1-65535"),
    (["simulate-brokers", "--ingest-endpoints", "a:b:c"], "bad address 'a:b:c'"),
    (["simulate-brokers", "--duration", "0"], "must be at least 0.001"),  # ran forever before
    (["admin", "clean-broker-data", "b0", "--broker-ids"], "expected at least one argument"),  # the whole set before
    (["admin", "clean-broker-data", "b0", "--broker-ids", "0"], "must be at least 1"),
    (["admin", "elect-master", "b0", "--cluster", "c", "--broker-id", "0"], "must be at least 1"),
    (["admin", "elect-master", "b0", "--cluster", "c", "--broker-id", "9" * 23], "must be at most 4611686018427387904"),
    (["admin", "clean-broker-data", "b0", "--broker-ids", "1", "9" * 23], "must be at most 4611686018427387904"),
    (["up", "--demo-groups", "100000"], "at most 64000"),
    (["ingest", "--insecure", "--kafka-bootstrap", "k:1", "--workers", "100000"], "at most 256"),
    (["ingest", "--insecure", "--kafka-bootstrap", "k:1", "--listen", "127.0.0.1:0"], "port 1-65535"),
    (["up", "--topic-prefix", "bad prefix/"], "does not make Kafka topic names"),  # failed after Kafka started
    (["ingest", "--insecure", "--kafka-bootstrap", "k:1", "--topic-prefix", "x" * 240], "does not make Kafka topic"),
])
def test_addresses_ids_and_sizes_are_refused_where_they_are_parsed(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_paths_that_cannot_be_directories_or_files_are_refused_before_anything_starts(tmp_path, capsys):
    from electra import cli
    from electra.bench import stream

    afile = tmp_path / "afile"
    afile.write_text("x")
    for run, match in ((lambda: cli.main(["up", "--insecure", "--data-dir", str(afile / "sub")]), "--data-dir"),
                       (lambda: stream.main(["--out", str(afile)]), "--out"),
                       (lambda: cli.main(["simulate-brokers", "--no-stdin", "--ids-file", str(tmp_path)]),
                        "is a directory"),
                       (lambda: cli.main(["simulate-brokers", "--no-stdin", "--ids-file", str(tmp_path / "no" / "x")]),
                        "does not exist")):
        with pytest.raises(SystemExit) as e:
            run()
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err


def test_contradicting_or_dangling_options_are_refused(tmp_path, capsys):
    from electra import cli
    from electra.bench import stream

    for run, match in ((lambda: cli.main(["up", "--insecure", "--data-dir", str(tmp_path), "--tier-uri", "/x",
                                          "--no-tier"]), "contradict"),  # the tier was used before
                       (lambda: stream.main(["--sets", "5", "--kill", "10"]), "only 5 sets")):  # --kill given
        with pytest.raises(SystemExit) as e:
            run()
        assert e.value.code == 2
        assert match in capsys.readouterr().err


def test_runs_whose_options_would_be_ignored_or_fail_later_are_refused_up_front(capsys):
    """A replayed seed or episode with a range, a chaos tick a node refuses, a benchmark's --job-arg the job does
    not take (it failed only after Kafka and the controllers started), more sets to kill than there are."""
    from electra import cli
    from electra.bench import failover, stream

    for run, match in ((lambda: cli.main(["sim", "--seed", "5", "--seeds", "100"]), "--seed replays one seed"),
                       (lambda: cli.main(["sim", "--seed", "5", "--start", "7"]), "--seed replays one seed"),
                       (lambda: cli.main(["sim", "--mutations", ","]), "names none"),
                       (lambda: cli.main(["sim", "--nodes", "100000"]), "at most 15"),
                       (lambda: cli.main(["chaos", "--episode", "3", "--first-episode", "5"]), "drop --first-episode"),
                       (lambda: cli.main(["chaos", "--out", " "]), "--out must not be empty"),
                       (lambda: cli.main(["chaos", "--tick-ms", "100000000"]), "at most 60000"),
                       (lambda: stream.main(["--job-arg=--bogus"]), "unrecognized arguments: --bogus"),
                       (lambda: failover.main(["--job-arg=--read-tasks=-1"]), "--read-tasks: must be at least 0"),
                       (lambda: stream.main(["--sets", "5", "--kill", "6"]), "only 5 sets")):
        with pytest.raises(SystemExit) as e:
            run()
        assert e.value.code == 2
        assert match in capsys.readouterr().err


def test_node_names_the_variable_a_bad_setting_came_from(capsys, monkeypatch):
    from electra import cli

    monkeypatch.setenv("ELECTRA_NODE_ID", "abc")
    with pytest.raises(SystemExit) as exc:
        cli.main(["node", "--peers", "1=127.0.0.1:1", "--data-dir", "x"])
    assert exc.value.code == 2
    assert "bad value for id (from ELECTRA_NODE_ID):" in capsys.readouterr().err


@pytest.mark.parametrize("argv, usage", [(["admin", "metadata", "--bogus"], "electra admin metadata"),
                                         (["admin", "--endpoints", "http://127.0.0.1:1", "metadata", "--zz"],
                                          "electra admin metadata"),
                                         (["up", "--x"], "electra up"),
                                         (["chaos", "--bogus"], "electra chaos"),
                                         (["simulate-brokers", "--x"], "electra simulate-brokers")])
def test_an_unknown_argument_is_refused_by_the_sub_command_it_follows(argv, usage, capsys):
    """Not by the top-level parser, whose usage lists commands, not the options the user got wrong."""
    from electra import cli

    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{usage}: error: unrecognized arguments: {argv[-1]}" in err
    assert f"usage: {usage}" in err


def test_ingest_help_names_its_real_default_listen_address(capsys):
    """The help said `default :7401` (every interface, as `:PORT` reads) where the default is loopback only."""
    parser = build_parser()
    assert parser.parse_args(["ingest", "--kafka-bootstrap", "k:1", "--insecure"]).listen == ("127.0.0.1", 7401)
    with pytest.raises(SystemExit):
        parser.parse_args(["ingest", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default 127.0.0.1:7401;" in help_text, help_text


@pytest.mark.parametrize("argv", [["--long"], ["--sets", "3"], ["--fsync-delay-ms", "0"],
                                  ["--election-jitter-ticks", "1"], ["--long", "--sets", "5"]])
def test_chaos_pipeline_refuses_node_level_options_it_would_ignore(argv, monkeypatch, capsys, tmp_path):
    """QA: `chaos --pipeline` took --long, --sets, --fsync-delay-ms and --election-jitter-ticks and ran without them.
    Given explicitly, even at their default value, they are refused; left out, the pipeline run starts."""
    from electra.chaos import cli as chaos_cli
    from electra.cli import main

    started = []
    monkeypatch.setattr(chaos_cli, "_cmd_pipeline", lambda args: started.append(args) or 0)
    base = ["chaos", "--pipeline", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        main([*base, *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and not started, err
    assert err == f"error: {', '.join(a for a in argv if a.startswith('--'))} do not apply to --pipeline runs " \
                  "(docs/chaos.md)\n", err
    assert main([*base, "--mixed", "--episodes", "2"]) == 0 and len(started) == 1


def test_chaos_node_level_run_keeps_its_defaults_for_options_now_left_unset(monkeypatch, tmp_path):
    """--sets and --fsync-delay-ms have no argparse default (so --pipeline can tell them given): 3 and 0 still."""
    from electra.chaos import runner
    from electra.cli import main

    seen = []

    async def fake_run(cfg):
        seen.append(cfg)
        return 0, "RESULT"

    monkeypatch.setattr(runner, "run", fake_run)
    assert main(["chaos", "--faults", "kill", "--out", str(tmp_path)]) == 0
    assert main(["chaos", "--faults", "kill", "--out", str(tmp_path), "--sets", "5", "--fsync-delay-ms", "7"]) == 0
    assert [(c.sets, c.fsync_delay_ms) for c in seen] == [(3, 0), (5, 7)]


class _Terminated(Exception):
    pass


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_sim_reports_the_seeds_that_ran(how, monkeypatch, capsys):
    """QA: Ctrl-C in `electra sim --seeds 100000` printed no RESULT for the seeds that had run, and SIGTERM
    ended it on the spot (exit -15, not a word), where `electra chaos` and the benchmarks stop as on Ctrl-C."""
    import os
    import signal

    from electra.cli import main
    from electra.consensus import simulation

    ran = []

    def run_seed(seed, cfg):
        if len(ran) == 3:
            if how == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # the handler interrupts here, in the main thread
        ran.append(seed)
        return "ok"

    def terminated(*_):  # stands in for the default action (death) if the command installs no handler of its own
        raise _Terminated

    monkeypatch.setattr(simulation, "run_seed", run_seed)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        assert main(["sim", "--seeds", "10", "--mutations", "none"]) == 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    out, err = capsys.readouterr()
    assert "interrupted: reporting the 3 seed(s) that ran" in out
    assert "RESULT seeds=3 workloads=kv,controller runtime=node violations=0 " in out
    assert err == "electra sim: interrupted\n"


def test_chaos_takes_no_more_sets_than_a_node_serves_watchers(capsys):
    """QA: any --sets was taken: `--sets 1000000000` started the cluster, then built a billion set names (and
    would have run four tasks and an SSE watcher each) until the kernel killed it for memory."""
    from electra.api.http_limits import DEFAULT_LIMITS

    assert build_parser().parse_args(["chaos", "--sets", str(DEFAULT_LIMITS.max_watchers)]).sets == 200
    with pytest.raises(SystemExit) as exit_:  # refused by the parser: nothing started
        build_parser().parse_args(["chaos", "--sets", "1000000000"])
    assert exit_.value.code == 2
    assert "argument --sets: must be at most 200, got 1000000000" in capsys.readouterr().err


def test_a_file_given_for_an_output_directory_is_named_as_such(tmp_path, capsys):
    """QA: `electra chaos --out FILE` said "cannot create the directory (File exists)"."""
    from electra.cli_args import make_dir

    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(SystemExit) as exit_:
        make_dir(f, "--out")
    assert exit_.value.code == 2 and capsys.readouterr().err == f"error: --out {f} is a file, not a directory\n"
    assert make_dir(tmp_path / "a" / "b", "--out").is_dir()

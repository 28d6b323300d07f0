"""Numbers on every command line are checked where they are parsed (electra/cli_args.py)."""

from __future__ import annotations

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
    assert "argument --seeds: must be at least 0" in _error(capsys, cli, ["sim", "--seeds", "-5"])
    assert "argument --id: must be at least 0" in _error(capsys, cli, ["node", "--id", "-1"])
    assert "argument --first-episode: must be at least 0" in _error(capsys, cli, ["chaos", "--first-episode", "-1"])
    shard = cli.parse_args(["chaos", "--long", "--first-episode", "500", "--episodes", "500"])
    assert (shard.first_episode, shard.episodes) == (500, 500)


def test_a_benchmark_refuses_a_negative_duration(capsys):
    from bench import api

    with pytest.raises(SystemExit) as exc:
        api.main(["--duration", "-1"])
    assert exc.value.code == 2
    assert "argument --duration: must be at least 0, got -1" in capsys.readouterr().err


def test_chaos_refuses_an_unknown_fault_before_starting_anything():
    args = build_parser().parse_args(["chaos", "--faults", "kill,bogus"])
    with pytest.raises(SystemExit, match="unknown fault kind 'bogus'"):
        args.fn(args)
    args = build_parser().parse_args(["chaos", "--faults", "kill:nobody"])
    with pytest.raises(SystemExit, match="fault 'kill' has no mode 'nobody'"):
        args.fn(args)


@pytest.mark.parametrize("endpoints", ["nonsense", "127.0.0.1:99999", "127.0.0.1:x", ":7301"])
def test_admin_and_status_refuse_a_bad_endpoint_before_connecting(endpoints):
    for argv in (["admin", "--endpoints", endpoints, "replica-info", "s1"], ["status", "--endpoints", endpoints]):
        args = build_parser().parse_args(argv)
        with pytest.raises(SystemExit, match="error: --endpoints: bad address"):
            args.fn(args)

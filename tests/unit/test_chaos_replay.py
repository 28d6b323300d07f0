"""A failing chaos episode's printed replay command: parsed back, it names the settings the episode ran with."""

from __future__ import annotations

import shlex
from pathlib import Path

from electra.chaos.pipeline import PipelineConfig
from electra.chaos.pipeline import replay_command as pipeline_replay
from electra.chaos.runner import LONG_FAULT_S, RunConfig, replay_command
from electra.cli import build_parser


def test_a_replay_command_rebuilds_the_episode_it_names():
    """What the failing run printed must schedule the same faults over the same sets: --long's fault
    durations, the set count and the tick included (the schedule depends on them)."""
    cfg = RunConfig(out_dir=Path("."), seed=13, sets=5, tick_ms=200, mixed=True, fault_s=LONG_FAULT_S)
    args = build_parser().parse_args(shlex.split(replay_command(cfg, 612))[1:])
    assert (args.seed, args.episode, args.long, args.sets, args.tick_ms) == (13, 612, True, 5, 200)
    plain = build_parser().parse_args(shlex.split(replay_command(RunConfig(out_dir=Path(".")), 3))[1:])
    assert (plain.long, plain.mixed, plain.sets, plain.tick_ms) == (False, False, None, 100)  # None: RunConfig's 3
    bound = build_parser().parse_args(shlex.split(replay_command(RunConfig(out_dir=Path("."), recovery_bound_s=12.5),
                                                                 0))[1:])
    assert bound.recovery_bound_s == 12.5  # the verdict depends on it


def test_a_pipeline_replay_command_names_its_cluster_and_brokers():
    pcfg = PipelineConfig(out_dir=Path("."), nodes=5, tick_ms=50, broker_timeout_ms=3000, broker_sets=6, mixed=True)
    p = build_parser().parse_args(shlex.split(pipeline_replay(pcfg, 4))[1:])
    assert (p.pipeline, p.episode, p.nodes, p.tick_ms, p.broker_timeout_ms, p.broker_sets, p.mixed) == (
        True, 4, 5, 50, 3000, 6, True)

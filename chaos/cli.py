"""`electra chaos` arguments (registered on the main CLI by electra/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from electra.api.http_limits import DEFAULT_LIMITS
from electra.cli_args import make_dir, refuse
from electra.interrupts import terminate_as_interrupt

from .nemesis import KINDS, parse_kind

DEFAULT_KINDS = "kill,pause,partition,delay,loss,clock,clock-rate,disk-full,torn-tail,slow-disk,power-loss"
LONG_EPISODES = 1000
MAX_SETS = DEFAULT_LIMITS.max_watchers  # one watcher per set, all of them possibly on one node


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("chaos", help="fault injection on real controller processes, with linearizability and "
                                     "controller invariants checked (ends with a RESULT line)",
                       description="Real `electra node` processes under faults (kill, pause, partitions, delay, loss, "
                                   "clock jumps and rates, full and slow disks, torn tails, power loss), episode after "
                                   "episode, while clients write and read; each history is checked for "
                                   "linearizability and the controller's invariants. A failing episode prints the "
                                   "command that replays it. Files (histories, report.html, the cluster's data) go "
                                   "to --out/<time>/ and are kept. docs/chaos.md has the faults and checks.")
    c.add_argument("--episodes", type=int, minimum=1,
                   help=f"episodes to run (default 30, the CI run; {LONG_EPISODES} with --long)")
    c.add_argument("--long", action="store_true", help=f"the soak: {LONG_EPISODES} episodes, longer faults, mixed")
    c.add_argument("--seed", type=int, default=1, help="the nemesis and workload seed (printed for replays)")
    c.add_argument("--episode", type=int, minimum=0, help="replay exactly this episode of --seed")
    c.add_argument("--first-episode", type=int, default=None, minimum=0,
                   help="number the run's episodes from here: an episode's faults and workload depend only on "
                        "--seed and its number, so processes with disjoint ranges shard one soak")
    c.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    c.add_argument("--faults", default=DEFAULT_KINDS,
                   help=f"comma-separated fault kinds, one per episode in turn, each optionally KIND:MODE "
                        f"(kill:leader, partition:one-way, ...; known kinds: {', '.join(KINDS)})")
    c.add_argument("--mixed", action="store_true", help="up to three overlapping fault kinds per episode")
    c.add_argument("--sets", type=int, minimum=1, maximum=MAX_SETS,
                   help=f"broker sets per episode (independent keys; default 3, at most {MAX_SETS}: each set has its "
                        f"SSE watcher, and a node serves at most {MAX_SETS} watchers)")
    c.add_argument("--tick-ms", type=int, minimum=1, maximum=60_000, default=100,
                   help="Raft tick of the nodes (default 100 as electra up; election timeout 10-13 ticks)")
    c.add_argument("--out", default=".electra/chaos",
                   help="where each run's directory (<time>/: histories, report.html, the cluster's data) is kept "
                        "(default .electra/chaos)")
    c.add_argument("--insecure", action="store_true", help="plaintext nodes (default: mutual TLS, as electra up)")
    c.add_argument("--stop-on-failure", action="store_true")
    c.add_argument("--recovery-bound-s", type=float, default=30.0,
                   help="a write must be acknowledged this soon after the faults heal (default 30)")
    c.add_argument("--fsync-delay-ms", type=int,
                   help="every fsync of every node waits this long, the whole run (a slow disk everywhere; "
                        "default 0)")
    c.add_argument("--election-jitter-ticks", type=int, minimum=1, maximum=1000,
                   help="the nodes' election timeout spread in ticks (default: the node's, 4); 1 makes every "
                        "follower time out in the same tick, so split votes (and double votes) are likely")
    c.add_argument("--time-budget-s", type=float, minimum=1,
                   help="start no episode after this many seconds (then report; the first always runs)")
    c.add_argument("--pipeline", action="store_true",
                   help="also run tansu, ingest workers, the Spark job and simulated brokers, with pipeline faults "
                        "(kafka-restart, spark-kill, ingest-kill, broker-kill, broker-hang; docs/chaos.md)")
    c.add_argument("--broker-sets", type=int, minimum=1,
                   help="--pipeline: simulated broker sets (3 brokers each; default 4)")
    c.add_argument("--broker-timeout-ms", type=int, minimum=1,
                   help="--pipeline: the simulated brokers' heartbeat timeout (default 10000, RocketMQ's)")
    c.add_argument("--failover-bound-s", type=float, minimum=1,
                   help="--pipeline: a killed or hung master must be replaced this soon after its fault "
                        "(default 60)")
    c.set_defaults(fn=cmd_chaos)


def _check_combination(args: argparse.Namespace) -> None:
    """Options that would be silently ignored are refused: a run must do what its command line says."""
    if args.episode is not None and args.episodes is not None:
        refuse("--episode replays one episode of --seed: drop --episodes")
    pipeline_only = [o for o, v in (("--broker-sets", args.broker_sets),
                                    ("--broker-timeout-ms", args.broker_timeout_ms),
                                    ("--failover-bound-s", args.failover_bound_s)) if v is not None]
    if pipeline_only and not args.pipeline:
        refuse(f"{', '.join(pipeline_only)} apply to --pipeline runs only")
    node_level_only = [o for o, given in (("--long", args.long), ("--sets", args.sets is not None),
                                          ("--fsync-delay-ms", args.fsync_delay_ms is not None),
                                          ("--election-jitter-ticks", args.election_jitter_ticks is not None))
                       if given]
    if node_level_only and args.pipeline:  # the pipeline run has its own workload, fault lengths and nodes
        refuse(f"{', '.join(node_level_only)} do not apply to --pipeline runs (docs/chaos.md)")
    if args.episode is not None and args.first_episode is not None:
        refuse("--episode replays one episode: drop --first-episode")
    args.first_episode = args.first_episode or 0
    if not str(args.out).strip():
        refuse("--out must not be empty (it would be the current directory)")
    make_dir(args.out, "--out")  # the run's files go here: refused before anything starts if it cannot be


def cmd_chaos(args: argparse.Namespace) -> int:
    from .runner import LONG_FAULT_S, RunConfig, run

    _check_combination(args)
    if args.pipeline:
        return _cmd_pipeline(args)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    if not kinds:
        refuse(f"--faults {args.faults!r} names no fault kind; known: {', '.join(KINDS)}")
    for k in kinds:
        try:
            parse_kind(k)
        except ValueError as exc:
            refuse(f"--faults: {exc}")
    episodes = args.episodes if args.episodes is not None else LONG_EPISODES if args.long else RunConfig.episodes
    cfg = RunConfig(out_dir=Path(args.out) / time.strftime("%Y%m%d-%H%M%S"), episodes=episodes,
                    first_episode=args.first_episode, seed=args.seed, nodes=args.nodes, kinds=kinds,
                    mixed=args.mixed, sets=args.sets if args.sets is not None else RunConfig.sets,
                    tick_ms=args.tick_ms, secure=not args.insecure,
                    stop_on_failure=args.stop_on_failure,
                    time_budget_s=args.time_budget_s, recovery_bound_s=args.recovery_bound_s,
                    fsync_delay_ms=args.fsync_delay_ms or 0, election_jitter_ticks=args.election_jitter_ticks)
    if args.long:
        cfg.mixed, cfg.fault_s = True, LONG_FAULT_S
    if args.episode is not None:
        cfg.first_episode, cfg.episodes = args.episode, 1
    t0 = time.monotonic()
    with terminate_as_interrupt():  # unwinds like Ctrl-C, so the nodes, proxies and tmpfs mounts are cleaned up
        code, line = asyncio.run(run(cfg))
    print(f"run took {time.monotonic() - t0:.0f}s", flush=True)
    print(line, flush=True)
    return code


def _cmd_pipeline(args: argparse.Namespace) -> int:
    from .pipeline import DEFAULT_FAULTS, PipelineConfig, parse_entry, run

    faults = DEFAULT_FAULTS if args.faults == DEFAULT_KINDS else args.faults
    kinds = [k.strip() for k in faults.split(",") if k.strip()]
    if not kinds:
        refuse(f"--faults {faults!r} names no fault kind (docs/chaos.md has the pipeline's)")
    for k in kinds:
        try:
            parse_entry(k)
        except ValueError as exc:
            refuse(f"--faults: {exc}")
    cfg = PipelineConfig(out_dir=Path(args.out) / time.strftime("%Y%m%d-%H%M%S"),
                         episodes=args.episodes if args.episodes is not None else PipelineConfig.episodes,
                         first_episode=args.first_episode, seed=args.seed, nodes=args.nodes, kinds=kinds,
                         tick_ms=args.tick_ms, secure=not args.insecure, stop_on_failure=args.stop_on_failure,
                         time_budget_s=args.time_budget_s, recovery_bound_s=args.recovery_bound_s,
                         mixed=args.mixed,
                         **{k: v for k, v in (("broker_sets", args.broker_sets),
                                              ("broker_timeout_ms", args.broker_timeout_ms),
                                              ("failover_bound_s", args.failover_bound_s)) if v is not None})
    if args.episode is not None:
        cfg.first_episode, cfg.episodes = args.episode, 1
    t0 = time.monotonic()
    with terminate_as_interrupt():
        code, line = asyncio.run(run(cfg))
    print(f"run took {time.monotonic() - t0:.0f}s", flush=True)
    print(line, flush=True)
    return code

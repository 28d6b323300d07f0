"""The chaos checkers on hand-written histories: each accepts a correct history and rejects a broken one."""

from __future__ import annotations

import asyncio
import random

import pytest

from electra.chaos import checkers, controller_model
from electra.chaos.history import HistoryLog, operations
from electra.chaos.nemesis import KINDS, schedule, supported
from electra.chaos.proxy import LinkProxy
from electra.consensus.linearizability import Op, check
from electra.state.codes import Code

OK = int(Code.SUCCESS)


class H:
    """A tiny history builder: ops with explicit times."""

    def __init__(self) -> None:
        self.log = HistoryLog()
        self.next_id = 0

    def op(self, proc, s, kind, args, call, ret, status="ok", out=None, leader_read=True):
        i = self.next_id
        self.next_id += 1
        self.log.records.append({"type": "invoke", "id": i, "proc": proc, "set": s, "op": kind, "args": args,
                                 "mono": call, "wall": call})
        at = ret if ret is not None else call + 0.01  # an unknown op is given up on without an answer
        done = {"type": status, "id": i, "mono": at, "wall": at, "node": "n1"}
        if status == "ok":
            done["out"] = out or {}
            done["leader_read"] = leader_read
        self.log.records.append(done)
        self.log.records.sort(key=lambda r: r["mono"])
        return i


def _created(h: H, s: str = "a") -> None:
    for k, bid in enumerate((1, 2, 3)):
        h.op(0, s, "apply_broker_id", {"bid": bid}, k, k + 0.5, out={"code": OK})
    h.op(0, s, "elect", {"bid": 1, "designate": False}, 3, 3.5,
         out={"code": OK, "master": 1, "mepoch": 1, "sse": 1})


def _lin(h: H) -> checkers.Verdict:
    return checkers.check_linearizable(operations(h.log))


def test_a_sequential_controller_history_is_linearizable():
    h = H()
    _created(h)
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2], "sse": 1}, 4, 4.5,
         out={"code": OK, "sss": [1, 2], "sse": 2})
    h.op(0, "a", "elect", {"bid": 2, "designate": True}, 5, 5.5, out={"code": OK, "master": 2, "mepoch": 2, "sse": 3})
    h.op(0, "a", "replica_info", {}, 6, 6.5, out={"code": OK, "master": 2, "mepoch": 2, "sss": [2], "sse": 3})
    h.op(0, "a", "next_broker_id", {}, 7, 7.5, out={"code": OK, "next": 4})
    assert _lin(h).ok, _lin(h).detail


def test_a_stale_leader_read_is_not_linearizable_but_a_stale_follower_read_is_ignored():
    h = H()
    _created(h)
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2], "sse": 1}, 4, 4.5,
         out={"code": OK, "sss": [1, 2], "sse": 2})
    h.op(0, "a", "elect", {"bid": 2, "designate": True}, 5, 5.5, out={"code": OK, "master": 2, "mepoch": 2, "sse": 3})
    stale = {"code": OK, "master": 1, "mepoch": 1, "sss": [1, 2], "sse": 2}
    h.op(1, "a", "replica_info", {}, 6, 6.5, out=stale, leader_read=False)
    assert _lin(h).ok
    h.op(1, "a", "replica_info", {}, 7, 7.5, out=stale, leader_read=True)
    v = _lin(h)
    assert not v.ok and v.violations == 1 and "replica_info" in v.detail


def test_an_unknown_election_may_or_may_not_have_happened():
    h = H()
    _created(h)
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2, 3], "sse": 1}, 4, 4.5,
         out={"code": OK, "sss": [1, 2, 3], "sse": 2})
    h.op(1, "a", "elect", {"bid": 3, "designate": True}, 5, None, status="unknown")
    h.op(0, "a", "replica_info", {}, 6, 6.5, out={"code": OK, "master": 3, "mepoch": 2, "sss": [3], "sse": 3})
    assert _lin(h).ok
    h2 = H()
    _created(h2)
    h2.op(1, "a", "elect", {"bid": 3, "designate": True}, 5, None, status="unknown")
    h2.op(0, "a", "replica_info", {}, 6, 6.5, out={"code": OK, "master": 1, "mepoch": 1, "sss": [1], "sse": 1})
    assert _lin(h2).ok


def test_two_elections_acknowledged_at_the_same_epoch_are_caught():
    h = H()
    _created(h)
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2, 3], "sse": 1}, 4, 4.5,
         out={"code": OK, "sss": [1, 2, 3], "sse": 2})
    h.op(0, "a", "elect", {"bid": 2, "designate": True}, 5, 5.5, out={"code": OK, "master": 2, "mepoch": 2, "sse": 3})
    h.op(1, "a", "elect", {"bid": 3, "designate": True}, 5.1, 5.6, out={"code": OK, "master": 3, "mepoch": 2, "sse": 3})
    assert not _lin(h).ok
    v = checkers.check_one_master_per_epoch(h.log, operations(h.log))
    assert not v.ok and "epoch 2" in v.detail


def test_liveness_dependent_answers_are_allowed_either_way():
    h = H()
    _created(h)
    # The proposer may not have heard from broker 2 yet: refused as not alive, then accepted.
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2], "sse": 1}, 4, 4.5,
         out={"code": int(Code.CONTROLLER_BROKER_NOT_ALIVE)})
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 2], "sse": 1}, 5, 5.5,
         out={"code": OK, "sss": [1, 2], "sse": 2})
    h.op(0, "a", "register", {"bid": 2}, 6, 6.5, out={"code": OK, "master": None, "sss": [1, 2], "sse": 2})
    h.op(0, "a", "elect", {"bid": 2, "designate": False}, 7, 7.5,
         out={"code": int(Code.CONTROLLER_ELECT_MASTER_FAILED)})
    assert _lin(h).ok, _lin(h).detail
    # ... but a fenced request can never succeed.
    h.op(0, "a", "alter_sss", {"master": 1, "mepoch": 1, "sss": [1, 3], "sse": 1}, 8, 8.5,
         out={"code": OK, "sss": [1, 3], "sse": 3})
    assert not _lin(h).ok


def test_the_register_model_is_still_the_default():
    ops = [Op(0, "k", "put", 1, 0, 1, None, "ok"), Op(1, "k", "get", None, 2, 3, 1, "ok")]
    assert check(ops).ok
    assert not check([*ops, Op(1, "k", "get", None, 4, 5, 2, "ok")]).ok


def test_model_steps_over_sets_of_states():
    op = Op(0, "a", "apply_broker_id", {"bid": 1}, 0, 1, {"code": OK}, "ok")
    ok, states = controller_model.step(controller_model.INITIAL, op)
    assert ok and len(states) == 1 and next(iter(states)).brokers == {1}
    with pytest.raises(ValueError, match="no operation"):
        controller_model.step(states, Op(0, "a", "bogus", {}, 0, 1, {}, "ok"))


def test_epochs_going_backwards_for_one_watcher_are_caught():
    h = H()
    for k, epoch in enumerate((1, 2, 1)):
        h.log.records.append({"type": "watch", "set": "a", "conn": "a#1@n1", "mono": k, "wall": k,
                              "event": {"type": "ElectMaster", "newMasterElected": True,
                                        "newMasterBrokerId": epoch, "masterEpoch": epoch}})
    v = checkers.check_monotonic_epochs(h.log, [])
    assert not v.ok and "1 after 2" in v.detail


def _watched(log: HistoryLog, conn: str, ident: int, sse_epoch: int, kind: str = "role-change") -> None:
    log.add("watch", set="a", node=conn[-2:], conn=conn, kind=kind, id=str(ident),
            event={"type": "AlterSyncStateSet", "brokerName": "a", "index": ident, "syncStateSetEpoch": sse_epoch})


def test_a_resuming_watcher_that_misses_or_repeats_a_role_change_is_caught():
    log = HistoryLog()
    _watched(log, "a#1@n1", 10, 2)
    _watched(log, "a#1@n1", 12, 3)
    _watched(log, "a#2@n2", 15, 4)  # resumed on another node: the next change, nothing missed
    _watched(log, "a#3@n3", 30, 9, kind="resync")  # that node no longer held them: a resync restarts the count
    _watched(log, "a#3@n3", 31, 10)
    v = checkers.check_watchers_miss_nothing(log)
    assert v.ok, v.detail
    repeated = HistoryLog()
    repeated.records = list(log.records)
    _watched(repeated, "a#4@n1", 31, 10)  # sent again after a reconnect
    v = checkers.check_watchers_miss_nothing(repeated)
    assert not v.ok and "event 31 on a#4@n1 after 31" in v.detail
    _watched(log, "a#4@n1", 40, 12)  # epoch 11's change never arrived
    v = checkers.check_watchers_miss_nothing(log)
    assert not v.ok and "a role change was missed" in v.detail


def test_two_leaders_in_one_term_are_caught():
    log = HistoryLog()
    log.add("leader", node="n1", term=3)
    log.add("leader", node="n2", term=4)
    assert checkers.check_one_leader_per_term(log).ok
    log.add("leader", node="n3", term=4)
    v = checkers.check_one_leader_per_term(log)
    assert not v.ok and "term 4" in v.detail


def test_lost_acknowledged_writes_are_counted():
    h = H()
    _created(h)
    ops = operations(h.log)
    assert checkers.lost_acknowledged(ops, {"a": {"brokers": {1, 2, 3}, "mepoch": 1, "sse": 1}})[0] == 0
    lost, why = checkers.lost_acknowledged(ops, {"a": {"brokers": {1, 2}, "mepoch": 0, "sse": 0}})
    assert lost == 2 and "broker id 3" in why


def test_schedules_are_seeded_and_cover_every_kind_round_robin():
    kinds = ["kill", "pause", "partition", "delay", "loss", "clock", "disk-full", "torn-tail"]
    a = [schedule(7, n, kinds, 3, mixed=False) for n in range(16)]
    b = [schedule(7, n, kinds, 3, mixed=False) for n in range(16)]
    assert [[(f.kind, f.mode, f.start, f.param) for f in fs] for fs in a] == \
           [[(f.kind, f.mode, f.start, f.param) for f in fs] for fs in b]
    assert {fs[0].kind for fs in a} == set(kinds)
    for n in range(50):
        fs = schedule(3, n, kinds, 5, mixed=True)
        assert 1 <= len(fs) <= 3 and all(f.start < f.end for f in fs)
        assert len(fs) == 1 or "torn-tail" not in {f.kind for f in fs}


def test_unsupported_kinds_are_named_with_the_reason(monkeypatch):
    from electra.chaos import nemesis

    monkeypatch.setattr(nemesis, "c_compiler", lambda: None)  # a machine without cc, root or libfaketime
    monkeypatch.setattr(nemesis, "can_mount", lambda: False)
    monkeypatch.setattr(nemesis, "faketime_library", lambda: None)
    kinds, skipped = supported(["kill", "slow-disk", "disk-full", "clock"])
    assert kinds == ["kill"]
    assert "C compiler" in skipped["slow-disk"] and "root" in skipped["disk-full"] and "faketime" in skipped["clock"]
    with pytest.raises(ValueError, match="unknown fault kind"):
        supported(["meteor"])
    assert "slow-disk" in KINDS


def test_the_link_proxy_forwards_blocks_one_way_and_heals():
    async def scenario() -> None:
        received: list[bytes] = []

        async def echo(reader, writer):
            while data := await reader.read(100):
                received.append(data)
                writer.write(b"re:" + data)
                await writer.drain()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        target = server.sockets[0].getsockname()[1]
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        listen = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        link = LinkProxy(1, 2, listen, target, random.Random(0))
        await link.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            writer.write(b"hello")
            assert await asyncio.wait_for(reader.read(100), 5) == b"re:hello"
            link.blocked.add(link.direction(2, 1))  # replies lost, requests still arrive
            writer.write(b"again")
            await writer.drain()
            for _ in range(50):
                if len(received) == 2:
                    break
                await asyncio.sleep(0.05)
            assert received == [b"hello", b"again"]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(100), 0.5)
            link.heal()  # the damaged connection is reset; a new one works
            assert await asyncio.wait_for(reader.read(100), 5) == b""
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            writer.write(b"new")
            assert await asyncio.wait_for(reader.read(100), 5) == b"re:new"
            writer.close()
        finally:
            await link.stop()
            server.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_unavailability_runs_from_a_fault_to_the_first_write_invoked_after_it_and_acknowledged():
    h = H()
    _created(h)  # writes acknowledged up to t=3.5
    h.log.records.append({"type": "fault-start", "mono": 4.0, "wall": 4.0, "kind": "kill", "mode": "leader",
                          "fault": "kill(leader:n1)"})
    h.op(1, "a", "register", {"bid": 1}, 3.9, 6.0, out={"code": OK, "master": None, "sss": [1], "sse": 1})
    h.op(1, "a", "replica_info", {}, 4.5, 4.6, out={"code": OK})  # reads do not count
    h.op(2, "a", "apply_broker_id", {"bid": 2}, 4.2, 5.0, status="unknown")
    h.op(3, "a", "apply_broker_id", {"bid": 2}, 5.5, 6.5, out={"code": OK})
    h.log.records.sort(key=lambda r: r["mono"])
    assert checkers.unavailability(h.log, operations(h.log)) == [("kill(leader)", 2.5)]


def test_a_fault_entry_may_pin_its_mode():
    from electra.chaos.nemesis import parse_kind

    assert parse_kind("kill") == ("kill", None) and parse_kind("kill:all") == ("kill", "all")
    assert parse_kind("partition:one-way") == ("partition", "one-way")
    assert {f.mode for n in range(10) for f in schedule(1, n, ["kill:leader"], 3, mixed=False)} == {"leader"}
    with pytest.raises(ValueError, match="no mode"):
        parse_kind("delay:majority")


def test_a_stalled_leader_stays_cut_off_past_the_end_of_a_lease_without_its_margin():
    """Healed sooner, it would hear of the new term before its too-long lease ran out (docs/chaos.md)."""
    from electra.chaos.nemesis import STALL_PARTITION_S, STALL_S

    assert 0.81 < STALL_S < 2.0 < STALL_PARTITION_S  # a correct lease, a lease without its margin (100 ms ticks)
    for mixed in (False, True):
        faults = [f for n in range(30) for f in schedule(2, n, ["partition:stalled-leader"], 3, mixed=mixed)]
        assert faults and all(f.end - f.start >= STALL_PARTITION_S for f in faults)


def test_unavailability_starts_once_the_fault_is_in_force():
    """A write invoked while the nemesis was still cutting the leader off, and answered by it, is no recovery."""
    h = H()
    _created(h)
    h.log.records.append({"type": "fault-start", "mono": 4.0, "wall": 4.0, "kind": "partition",
                          "mode": "isolate-leader", "fault": "partition(isolate-leader:n1)", "injected": 4.05})
    h.op(1, "a", "register", {"bid": 1}, 4.01, 4.03, out={"code": OK, "master": None, "sss": [1], "sse": 1})
    h.op(2, "a", "apply_broker_id", {"bid": 2}, 4.5, 5.25, out={"code": OK})
    h.log.records.sort(key=lambda r: r["mono"])
    [(what, seconds)] = checkers.unavailability(h.log, operations(h.log))
    assert what == "partition(isolate-leader)" and seconds == pytest.approx(1.2)


def test_unavailability_ends_at_the_earliest_acknowledgement_not_at_the_first_invoked_write():
    h = H()
    _created(h)
    h.log.records.append({"type": "fault-start", "mono": 4.0, "wall": 4.0, "kind": "kill", "mode": "leader",
                          "fault": "kill(leader:n1)", "injected": 4.0})
    h.op(1, "a", "register", {"bid": 1}, 4.1, 7.0, out={"code": OK, "master": None, "sss": [1], "sse": 1})
    h.op(2, "a", "apply_broker_id", {"bid": 2}, 4.5, 5.5, out={"code": OK})  # retried less, answered first
    h.log.records.sort(key=lambda r: r["mono"])
    assert checkers.unavailability(h.log, operations(h.log)) == [("kill(leader)", 1.5)]


def test_a_closed_proxy_hub_leaves_no_descriptor_open():
    """Each episode builds and closes a hub: a 1,000-episode soak must not run out of descriptors.

    (Its event loop's selector and self-pipe are the hub's descriptors; counting /proc/self/fd instead raced
    with other tests' daemon threads in the same process.)"""
    from electra.chaos.proxy import ProxyHub
    from electra.local_ports import free_ports

    hub = ProxyHub(1)
    hub.add(1, 2, *free_ports(2))
    selector_fd = hub._loop._selector.fileno()  # type: ignore[attr-defined]
    assert selector_fd >= 0
    hub.close()
    assert hub._loop.is_closed()

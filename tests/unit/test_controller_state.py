"""The controller state machine: every request, every error code, and invariants under random sequences."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from electra.state import commands as C
from electra.state.codes import Code
from electra.state.elect_policy import elect
from electra.state.liveness import BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.state.results import UpdateBrokerAddressEvent, WriteResult

NOW = 1_000_000


def live(*ids, epoch=1, offsets=None, priorities=None, dead=()):
    infos = {}
    for i in ids:
        infos[i] = BrokerLiveInfo(i, f"10.0.0.{i}:10911", NOW - (20_000 if i in dead else 100),
                                  epoch=epoch if not isinstance(epoch, dict) else epoch.get(i, 1),
                                  max_offset=(offsets or {}).get(i, 100), priority=(priorities or {}).get(i, 5))
    return infos


class Controller:
    """Applies commands in order, as every replica does."""

    def __init__(self) -> None:
        self.sm = ControllerStateMachine()
        self.index = 0
        self.events: list[dict] = []
        self.sm.on_event(lambda i, e: self.events.append(e))

    def __call__(self, cmd: bytes) -> WriteResult:
        self.index += 1
        return self.sm.apply(self.index, cmd)

    def register(self, name: str, n: int, cluster: str = "c") -> None:
        for bid in range(1, n + 1):
            assert self.sm.get_next_broker_id(cluster, name).header()["nextBrokerId"] == bid
            r = self(C.apply_broker_id(cluster, name, bid, f"10.0.0.{bid}:10911;{bid}"))
            assert r.code == Code.SUCCESS, r
            r = self(C.register_broker(cluster, name, bid, f"10.0.0.{bid}:10911", NOW, live(*range(1, n + 1))))
            assert r.code == Code.SUCCESS, r


def test_broker_id_allocation_and_idempotent_apply():
    c = Controller()
    assert c.sm.get_next_broker_id("c", "b").header()["nextBrokerId"] == 1
    assert c(C.apply_broker_id("c", "b", 2, "a:1;t")).code == Code.CONTROLLER_BROKER_ID_INVALID  # new set: id 1 only
    assert c(C.apply_broker_id("c", "b", 1, "a:1;t")).code == Code.SUCCESS
    assert c(C.apply_broker_id("c", "b", 1, "a:1;t")).code == Code.SUCCESS  # retry by the same broker
    assert c(C.apply_broker_id("c", "b", 1, "z:9;other")).code == Code.CONTROLLER_BROKER_ID_INVALID
    assert c.sm.get_next_broker_id("c", "b").header()["nextBrokerId"] == 2
    assert c(C.apply_broker_id("c", "b", 7, "d:4;x")).code == Code.SUCCESS  # any unused id is accepted
    assert c.sm.get_next_broker_id("c", "b").header()["nextBrokerId"] == 3  # counts adds, not max id + 1
    assert [e["type"] for e in c.events] == ["ApplyBrokerId", "ApplyBrokerId"]


def test_register_broker_codes_master_info_and_address_update():
    c = Controller()
    assert c(C.register_broker("c", "b", 1, "a", NOW, {})).code == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    c(C.apply_broker_id("c", "b", 1, "a:1;t"))
    assert c(C.register_broker("c", "b", 2, "a", NOW, {})).code == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    r = c(C.register_broker("c", "b", 1, "a:1", NOW, live(1)))
    assert r.code == Code.SUCCESS and r.header()["masterBrokerId"] is None and not r.events
    c(C.elect_master("c", "b", 1, NOW, live(1)))
    r = c(C.register_broker("c", "b", 1, "new:2", NOW, live(1)))
    assert r.header()["masterBrokerId"] == 1 and r.header()["masterEpoch"] == 1
    assert r.events == (UpdateBrokerAddressEvent("c", "b", "new:2", 1),)
    assert c.sm.get_replica_info("b").header()["masterAddress"] == "new:2"
    r = c(C.register_broker("c", "b", 1, "new:2", NOW, live(1, dead=(1,))))
    assert r.header()["masterBrokerId"] is None  # a dead master is not reported


def test_refused_apply_and_register_still_name_the_requests_cluster_and_set():
    """RocketMQ builds ApplyBrokerIdResponseHeader / RegisterBrokerToControllerResponseHeader(clusterName,
    brokerName) before any check, so its 2014 and 2010 replies carry both (the master's fields null)."""
    c = Controller()
    no_master = dict.fromkeys(("masterBrokerId", "masterAddress", "masterEpoch", "syncStateSetEpoch"))
    r = c(C.apply_broker_id("c", "b", 2, "a:1;t")).to_response()  # a new set takes id 1 only
    assert r["code"] == Code.CONTROLLER_BROKER_ID_INVALID and r["header"] == {"clusterName": "c", "brokerName": "b"}
    c(C.apply_broker_id("c", "b", 1, "a:1;t"))
    r = c(C.apply_broker_id("c", "b", 1, "z:9;other")).to_response()  # id 1 is another broker's
    assert r["code"] == Code.CONTROLLER_BROKER_ID_INVALID and r["header"] == {"clusterName": "c", "brokerName": "b"}
    r = c(C.register_broker("c", "nope", 1, "a:1", NOW, {})).to_response()  # no such set
    assert r["code"] == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert r["header"] == {"clusterName": "c", "brokerName": "nope", **no_master} and r["body"] is None
    r = c(C.register_broker("c", "b", 2, "a:2", NOW, {})).to_response()  # no such broker in the set
    assert r["code"] == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert r["header"] == {"clusterName": "c", "brokerName": "b", **no_master} and r["body"] is None
    r = c(C.register_broker("c", "b", 1, "a:1", NOW, {})).to_response()  # success, no master yet: the same keys
    assert r["code"] == Code.SUCCESS and r["header"] == {"clusterName": "c", "brokerName": "b", **no_master}


def test_first_election_is_the_first_asker_then_policy_decides():
    c = Controller()
    c.register("b", 3)
    r = c(C.elect_master("c", "b", 2, NOW, live(1, 2, 3)))
    assert r.code == Code.SUCCESS and r.header()["masterBrokerId"] == 2
    assert r.header()["masterEpoch"] == 1 and r.header()["syncStateSetEpoch"] == 1
    assert r.body()["syncStateSet"] == [2] and r.body()["brokerMemberGroup"]["brokerAddrs"][1]
    r = c(C.elect_master("c", "b", 3, NOW, live(1, 2, 3)))
    assert r.code == Code.CONTROLLER_MASTER_STILL_EXIST and r.header()["masterBrokerId"] == 2
    assert not r.events


def test_election_prefers_sync_set_then_epoch_offset_priority():
    c = Controller()
    c.register("b", 3)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    c(C.alter_sync_state_set("b", 1, 1, [1, 2, 3], 1, NOW, live(1, 2, 3)))
    # Master 1 dies; 3 has the highest epoch.
    r = c(C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, live(1, 2, 3, dead=(1,), epoch={2: 4, 3: 5})))
    assert r.code == Code.SUCCESS and r.header()["masterBrokerId"] == 3 and r.header()["masterEpoch"] == 2
    assert c.sm.sets["b"].sync_state_set == {3}


def test_election_tie_breaks_are_deterministic_and_64_bit():
    infos = live(1, 2, 3, offsets={1: 5, 2: 5 + 2**33, 3: 5})
    assert elect({1, 2, 3}, None, None, None, infos, NOW) == 2  # RocketMQ's int cast could pick wrongly
    infos = live(1, 2, 3, priorities={1: 9, 2: 3, 3: 3})
    assert elect({1, 2, 3}, None, None, None, infos, NOW) == 2  # equal priority: lowest id
    assert elect({1, 2, 3}, None, 3, None, infos, NOW) == 3  # a live old master stays
    assert elect({1, 2}, None, None, 3, infos, NOW) is None  # designated outside the sync set
    assert elect({1, 2}, {1, 2, 3}, None, 3, infos, NOW) == 3  # ... unless unclean election is on


def test_failed_elections_controller_trigger_writes_broker_trigger_does_not():
    c = Controller()
    c.register("b", 2)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2)))
    nobody = live(1, 2, dead=(1, 2))
    r = c(C.elect_master("c", "b", 2, NOW, nobody))
    assert r.code == Code.CONTROLLER_ELECT_MASTER_FAILED and not r.events
    assert c.sm.sets["b"].master_epoch == 1
    r = c(C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, nobody))
    assert r.code == Code.CONTROLLER_MASTER_NOT_AVAILABLE
    assert c.sm.sets["b"].master_id is None and c.sm.sets["b"].master_epoch == 2
    assert c(C.elect_master("c", "nope", 1, NOW, {})).code == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_admin_designated_and_unclean_election():
    c = Controller()
    c.register("b", 3)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    r = c(C.elect_master("c", "b", 2, NOW, live(1, 2, 3), designate=True))
    assert r.code == Code.CONTROLLER_ELECT_MASTER_FAILED  # 2 is not in the sync set {1}
    r = c(C.elect_master("c", "b", 2, NOW, live(1, 2, 3), designate=True, unclean=True))
    assert r.code == Code.SUCCESS and r.header()["masterBrokerId"] == 2


def test_alter_sync_state_set_checks_in_rocketmq_order():
    c = Controller()
    c.register("b", 3)
    every = live(1, 2, 3)
    r = c(C.alter_sync_state_set("x", 1, 0, [1], 0, NOW, every))
    assert r.code == Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    c(C.elect_master("c", "b", 1, NOW, every))  # master 1, epochs 1/1, set {1}
    cases = [
        (C.alter_sync_state_set("b", 2, 1, [1], 1, NOW, every), Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),  # equal
        (C.alter_sync_state_set("b", 2, 1, [1, 2], 1, NOW, every), Code.CONTROLLER_INVALID_MASTER),
        (C.alter_sync_state_set("b", 1, 0, [1, 2], 1, NOW, every), Code.CONTROLLER_FENCED_MASTER_EPOCH),
        (C.alter_sync_state_set("b", 1, 1, [1, 2], 0, NOW, every), Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
        (C.alter_sync_state_set("b", 1, 1, [1, 9], 1, NOW, every), Code.CONTROLLER_INVALID_REPLICAS),
        (C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, live(1, 2, dead=(2,))), Code.CONTROLLER_BROKER_NOT_ALIVE),
        (C.alter_sync_state_set("b", 1, 1, [2, 3], 1, NOW, every), Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
    ]
    for cmd, code in cases:
        assert c(cmd).code == code
    r = c(C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, every))
    assert r.code == Code.SUCCESS and r.header()["newSyncStateSetEpoch"] == 2
    # The same request again loses the compare-and-set: exactly one winner.
    assert c(C.alter_sync_state_set("b", 1, 1, [1, 2, 3], 1, NOW, every)).code == \
        Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH


def test_remarks_are_rocketmqs_format_strings():
    """ReplicasInfoManager's String.format texts, braces and colons included; Java prints null as `null`."""
    c = Controller()
    c.register("b", 3)
    every = live(1, 2, 3)
    c(C.elect_master("c", "b", 1, NOW, every))  # master 1, epochs 1/1, set {1}
    why = "Rejecting alter syncStateSet request because "
    cases = [
        (C.alter_sync_state_set("b", 2, 1, [1, 2], 1, NOW, every), f"{why}the current leader is:{{1}}, not {{2}}"),
        (C.alter_sync_state_set("b", 1, 0, [1, 2], 1, NOW, every),
         f"{why}the current master epoch is:{{1}}, not {{0}}"),
        (C.alter_sync_state_set("b", 1, 1, [1, 2], 0, NOW, every),
         f"{why}the current syncStateSet epoch is:{{1}}, not {{0}}"),
        (C.alter_sync_state_set("b", 1, 1, [1, 9], 1, NOW, every), f"{why}the replicas {{9}} don't exist"),
        (C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, live(1, 2, dead=(2,))),
         f"{why}the replicas {{2}} don't alive"),
        (C.alter_sync_state_set("b", 1, 1, [2, 3], 1, NOW, every),
         f"{why}the newSyncStateSet don't contains origin leader {{1}}"),
        (C.elect_master("c", "b", 2, NOW, every),
         "The old master 1 is still alive, not need to elect new master for broker b"),
    ]
    for cmd, remark in cases:
        assert c(cmd).remark == remark
    c(C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, live(1, 2, 3, dead=(1, 2, 3))))  # 2004: no master now
    r = c(C.alter_sync_state_set("b", 1, 2, [1, 2], 1, NOW, every))
    assert r.code == Code.CONTROLLER_INVALID_MASTER and r.remark == f"{why}the current leader is:{{null}}, not {{1}}"


def test_clean_broker_data_paths():
    c = Controller()
    r = c(C.clean_broker_data("c", "b", None, True, NOW, {}))
    assert r.code == Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    c.register("b", 3)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    r = c(C.clean_broker_data("c", "b", None, False, NOW, live(1, 2, 3)))
    assert r.code == Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA  # a master exists
    r = c(C.clean_broker_data("c", "b", [2], False, NOW, live(1, 2, 3)))
    assert r.code == Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA  # 2 is alive
    assert c(C.clean_broker_data("c", "b", [2], False, NOW, live(1, 3))).code == Code.SUCCESS
    assert 2 not in c.sm.sets["b"].brokers
    r = c(C.clean_broker_data("c", "b", [1], True, NOW, live(1, 3)))  # removing the master fences it
    assert r.code == Code.SUCCESS and c.sm.sets["b"].master_id is None and c.sm.sets["b"].master_epoch == 2
    assert c(C.clean_broker_data("c", "b", None, True, NOW, {})).code == Code.SUCCESS
    assert "b" not in c.sm.sets
    assert c.sm.get_replica_info("b").code == Code.CONTROLLER_BROKER_METADATA_NOT_EXIST


def test_reads_sync_state_data_and_reelection_scan():
    c = Controller()
    c.register("b", 3)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    r = c.sm.get_sync_state_data(["b", "missing"], lambda _cluster, _name: live(1, 2, 3, dead=(3,)), NOW)
    info = r.body()["replicasInfoTable"]["b"]
    assert [x["brokerId"] for x in info["inSyncReplicas"]] == [1]
    assert [(x["brokerId"], x["alive"]) for x in info["notInSyncReplicas"]] == [(2, True), (3, False)]
    assert "missing" not in r.body()["replicasInfoTable"]
    assert c.sm.sets_needing_election(lambda _cluster, _name: live(1, 2, 3, dead=(1,)), NOW) == ["b"]
    assert c.sm.sets_needing_election(lambda _cluster, _name: live(1, 2, 3), NOW) == []
    # liveness is asked for under the set's own cluster: another cluster's heartbeats keep no master alive
    by_cluster = {"c": live(1, 2, 3, dead=(1,)), "c9": live(1, 2, 3)}
    assert c.sm.sets_needing_election(lambda cluster, n: by_cluster[cluster], NOW) == ["b"]


def test_malformed_commands_are_rejected_identically():
    c = Controller()
    assert c(b"\xc1").code == Code.CONTROLLER_INVALID_REQUEST
    assert c(b"\x81\xa2op\xa4nope").code == Code.CONTROLLER_INVALID_REQUEST


def test_liveness_table_follows_rocketmq_update_rule():
    t = LivenessTable()
    t.on_heartbeat("c", "b", 1, "a", 100, epoch=2, max_offset=50, confirm_offset=40)
    t.on_heartbeat("c", "b", 1, "a2", 200, epoch=2, max_offset=10, confirm_offset=5)  # older offsets ignored
    info = t.group("c", "b")[1]
    assert (info.epoch, info.max_offset, info.confirm_offset, info.last_update_ms) == (2, 50, 40, 200)
    assert info.broker_addr == "a2"
    assert t.expire(200 + 10_001) == [("c", "b", 1)] and len(t) == 0


def test_snapshot_round_trip_is_deterministic():
    c = Controller()
    c.register("b", 3)
    c.register("a", 2)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    out1, out2 = io.BytesIO(), io.BytesIO()
    c.sm.snapshot(out1)
    other = ControllerStateMachine()
    other.restore(io.BytesIO(out1.getvalue()))
    other.snapshot(out2)
    assert out1.getvalue() == out2.getvalue()
    assert other.get_replica_info("b") == c.sm.get_replica_info("b")


# --------------------------------------------------------------------------- properties
ids = st.sampled_from([1, 2, 3, 4])  # uniform, so later ids and different masters come up often
id_sets = st.frozensets(ids)
request = st.one_of(
    st.tuples(st.just("apply"), ids),
    st.tuples(st.just("elect"), st.sampled_from([-1, 1, 2, 3, 4]), st.booleans(), id_sets),
    st.tuples(st.just("alter"), ids, st.frozensets(ids, min_size=1), st.booleans(), id_sets),
    st.tuples(st.just("clean"), id_sets, st.booleans()),
)


def _to_command(sm: ControllerStateMachine, req) -> bytes:
    kind = req[0]
    if kind == "apply":
        return C.apply_broker_id("c", "g", req[1], f"h{req[1]}:1;{req[1]}")
    if kind == "elect":
        return C.elect_master("c", "g", req[1], NOW, live(*req[3]), designate=req[2])
    if kind == "alter":
        bs = sm.sets.get("g")
        master = bs.master_id if bs and req[3] else req[1]
        epochs = (bs.master_epoch, bs.sync_state_set_epoch) if bs and req[3] else (0, 0)
        return C.alter_sync_state_set("g", master or 0, epochs[0], req[2], epochs[1], NOW, live(*req[4]))
    return C.clean_broker_data("c", "g", sorted(req[1]) or None, req[2], NOW, live())


@settings(max_examples=400, deadline=None)
@given(st.lists(request, max_size=40))
def test_random_request_sequences_keep_the_invariants(reqs):
    a, b = ControllerStateMachine(), ControllerStateMachine()
    seen_masters: dict[int, int] = {}  # master epoch -> master
    last = (0, 0)
    reqs = [("apply", i) for i in (1, 2, 3, 4)] + reqs  # start from a registered set most of the time
    for k, req in enumerate(reqs, 1):
        cmd = _to_command(a, req)
        ra, rb = a.apply(k, cmd), b.apply(k, cmd)
        assert ra == rb  # replicas applying the same log agree
        bs = a.sets.get("g")
        if bs is None:  # wiped: a new set starts over
            last = (0, 0)
            seen_masters.clear()
            continue
        if bs.master_id is not None:
            assert seen_masters.setdefault(bs.master_epoch, bs.master_id) == bs.master_id  # one master per epoch
            assert bs.master_id in bs.sync_state_set  # the master is in its sync-state set
            assert bs.master_id in bs.brokers
        assert bs.master_epoch >= last[0] and bs.sync_state_set_epoch >= last[1]  # epochs never go back
        last = (bs.master_epoch, bs.sync_state_set_epoch)
        assert len(bs.brokers) == len(set(bs.brokers))
    sa, sb = io.BytesIO(), io.BytesIO()
    a.snapshot(sa)
    b.snapshot(sb)
    assert sa.getvalue() == sb.getvalue()


def test_answer_without_write_answers_as_apply_would_and_changes_nothing():
    c = Controller()
    c.register("b", 3)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3)))
    assert c(C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, live(1, 2, 3))).code == Code.SUCCESS
    before = io.BytesIO()
    c.sm.snapshot(before)
    same = C.register_broker("c", "b", 2, "10.0.0.2:10911", NOW, live(1, 2, 3))
    still = C.elect_master("c", "b", 2, NOW, live(1, 2, 3))
    unknown = C.register_broker("c", "nope", 1, "x", NOW, {})
    changes = [C.register_broker("c", "b", 2, "moved:1", NOW, live(1, 2, 3)),  # a new address
               C.elect_master("c", "b", 2, NOW, live(2, 3, dead=(1,))),  # the master is dead: a new one
               C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, live(dead=(1, 2, 3))),  # a failed one, recorded
               C.apply_broker_id("c", "b", 4, "d;4")]  # not a command this answers
    answers = [c.sm.answer_without_write(cmd) for cmd in (same, still, unknown)]
    assert [c.sm.answer_without_write(cmd) for cmd in changes] == [None] * len(changes)
    after = io.BytesIO()
    c.sm.snapshot(after)
    assert after.getvalue() == before.getvalue() and "nope" not in c.sm.sets
    assert answers[1] is not None and answers[1].code == Code.CONTROLLER_MASTER_STILL_EXIST
    events = len(c.events)
    assert answers == [c(cmd) for cmd in (same, still, unknown)]  # what applying them answers
    assert len(c.events) == events  # and applying them changes nothing either

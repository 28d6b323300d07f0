"""Typed controller commands: compatibility with logs and snapshots already written, round trips, refusals.

`data/controller_log_v1.msgpack` was written by the dict-based encoder that state/commands.py
had before the typed commands (commit 9885dcc): a 31-entry controller log covering every
request type and outcome, the responses and events each entry produced then, and the
snapshot after the last entry.
"""

from __future__ import annotations

import io
from pathlib import Path

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from electra.state import commands as C
from electra.state.codes import Code
from electra.state.liveness import BrokerLiveInfo
from electra.state.machine import ControllerStateMachine

V1 = msgpack.unpackb((Path(__file__).parent / "data" / "controller_log_v1.msgpack").read_bytes(),
                     strict_map_key=False)
# Responses changed on purpose since the log was written: by log index, the fields as they are now.
CHANGED_SINCE_V1: dict[int, dict] = {
    # Refusals carry the request's cluster and set name, as RocketMQ's response headers do.
    13: {"header": {"clusterName": "c", "brokerName": "b"}},
    14: {"header": {"clusterName": "c", "brokerName": "nope", "masterBrokerId": None, "masterAddress": None,
                    "masterEpoch": None, "syncStateSetEpoch": None}},
    # RocketMQ's remark texts (ReplicasInfoManager's format strings, braces included).
    16: {"remark": "The old master 1 is still alive, not need to elect new master for broker b"},
    18: {"remark": "Rejecting alter syncStateSet request because the current syncStateSet epoch is:{2}, not {1}"},
    21: {"remark": "The old master 3 is still alive, not need to elect new master for broker b"},
}
LIVE = [BrokerLiveInfo(1, "a:1", 10, 10_000, 3, 40, 30, 5), BrokerLiveInfo(2, "a:2", 9, 5_000)]

# One command of every type, with every optional field both set and left out.
EVERY_REQUEST = [
    C.ApplyBrokerId("c", "b", 1, "a:1;1", 10),
    C.RegisterBroker("c", "b", 1, "a:1", 10, LIVE),
    C.ElectMaster("c", "b", 1, False, False, 10, LIVE),
    C.ElectMaster("c", "b", C.CONTROLLER_TRIGGER, True, True, 10, [], expected_master_epoch=7),
    C.AlterSyncStateSet("b", 1, 2, [1, 2], 3, 10, LIVE),
    C.CleanBrokerData("c", "b", [2], False, 10, LIVE),
    C.CleanBrokerData(None, "b", None, True, 10, []),
    C.ReadEvent(),
]


def test_every_entry_of_a_v1_log_decodes_and_encodes_to_the_same_bytes():
    for index, data in V1["log"][:-1]:
        cmd = C.decode(data)
        assert type(cmd) in C.COMMAND_TYPES
        assert C.encode(cmd) == data, index
    with pytest.raises(ValueError, match="unknown request type"):
        C.decode(V1["log"][-1][1])  # the log's last entry is no command


def test_replaying_a_v1_log_gives_the_same_responses_events_and_snapshot():
    sm = ControllerStateMachine()
    for (index, data), want in zip(V1["log"], V1["responses"], strict=True):
        res = sm.apply(index, data)
        got = {**res.to_response(), "events": [e.to_public() for e in res.events]}
        want = {**want, **CHANGED_SINCE_V1.get(index, {})}
        if want["code"] == Code.CONTROLLER_INVALID_REQUEST:
            assert got["code"] == want["code"] and not got["events"]  # the remark now names the reason
        else:
            assert got == want, index
    out = io.BytesIO()
    sm.snapshot(out)
    assert out.getvalue() == V1["snapshot"]


def test_a_v1_snapshot_restores_to_the_state_the_log_builds():
    replayed = ControllerStateMachine()
    for index, data in V1["log"]:
        replayed.apply(index, data)
    restored = ControllerStateMachine()
    restored.restore(io.BytesIO(V1["snapshot"]))
    assert restored.applied == replayed.applied == len(V1["log"])
    assert restored.sets == replayed.sets and restored.sets


@pytest.mark.parametrize("cmd", EVERY_REQUEST, ids=lambda c: type(c).__name__)
def test_every_request_round_trips(cmd):
    data = C.encode(cmd)
    assert C.decode(data) == cmd
    assert msgpack.unpackb(data)["op"] == type(cmd).__struct_config__.tag  # the tag travels in `op`


def test_every_request_type_is_covered_here_and_has_a_handler():
    from electra.state.machine import _HANDLERS

    assert {type(c) for c in EVERY_REQUEST} == set(C.COMMAND_TYPES) == set(_HANDLERS)


def test_the_builders_write_the_typed_commands():
    live = {2: LIVE[1], 1: LIVE[0]}  # any order in, sorted by broker id on the wire
    assert C.decode(C.elect_master("c", "b", 1, 10, live)) == EVERY_REQUEST[2]
    assert C.decode(C.alter_sync_state_set("b", 1, 2, [2, 1, 2], 3, 10, live)) == EVERY_REQUEST[4]
    assert C.decode(C.clean_broker_data(None, "b", None, True, 10, {})) == EVERY_REQUEST[6]
    assert "expected_master_epoch" not in msgpack.unpackb(C.elect_master("c", "b", 1, 10, live))


def _raw(cmd: C.Command, **patch) -> bytes:
    d = msgpack.unpackb(C.encode(cmd))
    d.update(patch)
    return msgpack.packb({k: v for k, v in d.items() if v is not ...})


@pytest.mark.parametrize("data,reason", [
    (b"\xc1", "not a controller command"),
    (msgpack.packb([1, 2]), "Expected `object`"),
    (msgpack.packb({"name": "b"}), "missing required field `op`"),
    (_raw(EVERY_REQUEST[0], op="drop_everything"), "unknown request type - at `$.op`"),
    (_raw(EVERY_REQUEST[0], surprise=1), "unknown field `surprise`"),
    (_raw(EVERY_REQUEST[0], check_code=...), "missing required field `check_code`"),
    (_raw(EVERY_REQUEST[0], broker_id="1"), "$.broker_id"),
    (_raw(EVERY_REQUEST[2], designate=1), "$.designate"),
    (_raw(EVERY_REQUEST[4], master_epoch=2**31), "$.master_epoch"),
    (_raw(EVERY_REQUEST[4], new_set=[1, 2**63]), "$.new_set[1]"),
    (_raw(EVERY_REQUEST[1], live=[{**LIVE[0].to_wire(), "extra": 1}]), "$.live[0]"),
    (_raw(EVERY_REQUEST[1], live=[{**LIVE[0].to_wire(), "broker_id": 0}]), "$.live[0].broker_id"),
])
def test_anything_else_is_refused_naming_the_field_and_changes_nothing(data, reason):
    with pytest.raises(ValueError) as info:
        C.decode(data)
    assert reason in str(info.value)
    assert "drop_everything" not in str(info.value) and "2147483648" not in str(info.value)  # no values echoed
    sm = ControllerStateMachine()
    sm.restore(io.BytesIO(V1["snapshot"]))
    before, events = {n: bs.to_wire() for n, bs in sm.sets.items()}, []
    sm.on_event(lambda i, ev: events.append(ev))
    res = sm.apply(sm.applied + 1, data)
    assert res.code == Code.CONTROLLER_INVALID_REQUEST and reason in res.remark
    assert {n: bs.to_wire() for n, bs in sm.sets.items()} == before and not events


# ---------------------------------------------------------------------- any values: the v1 bytes
def _v1_bytes(cmd: C.Command) -> bytes:
    """What the dict-based encoder wrote for these values: {"op": ..., fields in order}, no absent fence."""
    d = {"op": type(cmd).__struct_config__.tag}
    for f in msgspec.structs.fields(cmd):
        v = getattr(cmd, f.name)
        if f.name == "expected_master_epoch" and v is None:
            continue
        d[f.name] = [i.to_wire() for i in v] if f.name == "live" else v
    return msgpack.packb(d, use_bin_type=True)


_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)
_bid = st.integers(1, 2**62)
_name = st.text(max_size=12)
_lives = st.lists(st.builds(BrokerLiveInfo, _bid, _name, _i64, _i64, _i32, _i64, _i64, _i32), max_size=3)
_ids = st.lists(_i64, max_size=4)
_any_command = st.one_of(
    st.builds(C.ApplyBrokerId, _name, _name, _i64, _name, _i64),
    st.builds(C.RegisterBroker, _name, _name, _i64, _name, _i64, _lives),
    st.builds(C.ElectMaster, _name, _name, _i64, st.booleans(), st.booleans(), _i64, _lives, st.none() | _i32),
    st.builds(C.AlterSyncStateSet, _name, _i64, _i32, _ids, _i32, _i64, _lives),
    st.builds(C.CleanBrokerData, st.none() | _name, _name, st.none() | _ids, st.booleans(), _i64, _lives),
)


@settings(max_examples=300, deadline=None)
@given(_any_command)
def test_any_command_round_trips_in_exactly_the_v1_bytes(cmd):
    data = C.encode(cmd)
    assert data == _v1_bytes(cmd)
    assert C.decode(data) == cmd

"""RocketMQ's Java integer types at the Kafka record rule and in the state machine (the last line)."""

from __future__ import annotations

import msgpack
import pytest

from electra.state import commands as C
from electra.state.codes import Code
from electra.state.liveness import BrokerLiveInfo
from electra.state.machine import ControllerStateMachine
from electra.streaming.records import InvalidHeartbeat, validate_heartbeat

HB = {"clusterName": "c", "brokerName": "b", "brokerAddr": "a:1", "brokerId": 1}


@pytest.mark.parametrize("field,value", [
    ("epoch", 2**31), ("epoch", 2**64), ("electionPriority", -(2**31) - 1), ("maxOffset", 2**63),
    ("confirmOffset", -(2**63) - 1), ("brokerId", 2**62 + 1), ("ts", 2**63), ("epoch", True), ("epoch", 1.5),
    # a double past 2**53 no longer holds the integer sent (123456789012345678.0 reads as ...680)
    ("maxOffset", 123456789012345678.0), ("confirmOffset", -float(2**60)),
])
def test_heartbeat_records_outside_javas_types_are_invalid_and_named(field, value):
    with pytest.raises(InvalidHeartbeat) as info:
        validate_heartbeat({**HB, field: value})
    assert str(info.value).startswith(field) and str(info.value).endswith("required")


def test_an_integral_double_within_2_to_the_53_is_read_as_its_integer():
    hb = validate_heartbeat({**HB, "maxOffset": float(2**53), "epoch": 3.0})
    assert hb["maxOffset"] == 2**53 and type(hb["maxOffset"]) is int and hb["epoch"] == 3


def test_heartbeat_records_at_the_bounds_are_valid():
    hb = validate_heartbeat({**HB, "epoch": 2**31 - 1, "electionPriority": -(2**31), "maxOffset": 2**63 - 1})
    assert hb["epoch"] == 2**31 - 1 and hb["maxOffset"] == 2**63 - 1


LIVE = {"broker_id": 1, "broker_addr": "a:1", "last_update_ms": 1, "timeout_ms": 1000, "epoch": 1,
        "max_offset": 1, "confirm_offset": 1, "priority": 1}


@pytest.mark.parametrize("over", [{"epoch": 2**31}, {"priority": 2**40}, {"max_offset": 2**63},
                                  {"broker_id": 0}, {"broker_addr": 5}, {"surprise": 1}])
def test_liveness_records_outside_their_types_are_refused(over):
    with pytest.raises((ValueError, TypeError)):
        BrokerLiveInfo.from_wire({**LIVE, **over})


def _machine_with_master():
    sm = ControllerStateMachine()
    live = [BrokerLiveInfo(1, "a:1", 10, 10_000, 1, 1, 1)]
    assert sm.apply(1, C.apply_broker_id("c", "b", 1, "a:1;1")).code == Code.SUCCESS
    assert sm.apply(2, C.register_broker("c", "b", 1, "a:1", 10, live)).code == Code.SUCCESS
    assert sm.apply(3, C.elect_master("c", "b", 1, 10, live)).code == Code.SUCCESS
    return sm


@pytest.mark.parametrize("patch", [{"master_epoch": 2**63}, {"master_epoch": 2**31},
                                   {"sync_state_set_epoch": 2**64 - 1}, {"new_set": [2**64 - 1]},
                                   {"live": [{**LIVE, "epoch": 2**40}]}])
def test_the_state_machine_refuses_out_of_range_commands_and_the_set_stays_writable(patch):
    sm = _machine_with_master()
    before = sm.get_replica_info("b")
    cmd = msgpack.unpackb(C.alter_sync_state_set("b", 1, 1, [1], 1, 10, []))
    cmd.update(patch)
    res = sm.apply(4, msgpack.packb(cmd))
    assert res.code == Code.CONTROLLER_INVALID_REQUEST
    assert sm.get_replica_info("b") == before
    assert sm.apply(5, C.apply_broker_id("c", "b", 2, "a:2;2")).code == Code.SUCCESS


@pytest.mark.parametrize("value,length", [
    (b"0", 0), (b"000", 0), (b"17", 17), (b"0" * 5000 + b"2", 2), (b"9" * 19, int("9" * 19)),
    (b"1" + b"0" * 19, 2**63), (b"0" * 5000 + b"9" * 5000, 2**63),  # over 19 significant digits: over any limit
    (b"", None), (b"-1", None), (b"1 ", None), (b"+1", None), (b"0x10", None), ("²".encode(), None),
])
def test_a_content_length_reads_as_its_number_whatever_its_leading_zeros_and_past_19_digits_as_over_any_limit(
        value, length):
    from electra.state.limits import content_length

    assert content_length(value) == length

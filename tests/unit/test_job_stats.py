"""The streaming job's batch report: consumed offsets from either Kafka source, the record's fields."""

from __future__ import annotations

import json
from types import SimpleNamespace

from electra.streaming.job_stats import batch_record, consumed_offsets


def test_consumed_offsets_from_the_python_source_and_from_sparks_connector():
    ours = SimpleNamespace(endOffset=json.dumps({"electra.heartbeats:0": 12, "electra.heartbeats:1": 3}))
    spark = SimpleNamespace(endOffset=json.dumps({"electra.events": {"0": 7}}))
    broken = SimpleNamespace(endOffset="not json")
    assert consumed_offsets([ours, spark, broken]) == {"electra.heartbeats:0": 12, "electra.heartbeats:1": 3,
                                                       "electra.events:0": 7}
    assert consumed_offsets(None) == {}


def test_batch_record_carries_the_batch_what_it_sent_and_the_offsets():
    progress = SimpleNamespace(batchId=41, numInputRows=900, batchDuration=1234,
                               sources=[SimpleNamespace(endOffset='{"electra.heartbeats:0": 5}')])
    rec = batch_record(progress, {"proposals": 2, "liveness": 30, "dead_letters": 1}, 9, 17, 1_000)
    assert rec == {"batchId": 41, "rows": 900, "batchMs": 1234, "proposals": 2, "liveness": 30, "deadLetters": 1,
                   "deadLettersTotal": 9, "proposalsTotal": 17, "consumed": {"electra.heartbeats:0": 5}, "ts": 1_000}

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


def test_batch_record_from_sparks_progress_json():
    progress = {"batchId": 3, "numInputRows": 10, "batchDuration": 400,
                "sources": [{"endOffset": {"electra.heartbeats:1": 8}}, {"endOffset": {"electra.events": {"0": 2}}}]}
    rec = batch_record(progress, {}, 0, 0, 5)
    assert (rec["batchId"], rec["rows"], rec["batchMs"]) == (3, 10, 400)
    assert rec["consumed"] == {"electra.heartbeats:1": 8, "electra.events:0": 2}


class _Query:
    """What the job's loop reads of a streaming query: the last progress and the recent ones (Spark's JSON)."""

    def __init__(self) -> None:
        self.recentProgress: list[dict] = []

    @property
    def lastProgress(self) -> dict | None:
        return self.recentProgress[-1] if self.recentProgress else None

    def finish(self, batch_id: int) -> None:
        self.recentProgress.append({"batchId": batch_id, "numInputRows": batch_id, "batchDuration": 100,
                                    "durationMs": {"addBatch": 60, "walCommit": 0},
                                    "stateOperators": [{"allUpdatesTimeMs": 5, "commitTimeMs": 7, "numRowsTotal": 1}],
                                    "sources": [{"endOffset": {"electra.heartbeats:0": batch_id}}]})


class _Output:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send_stats(self, topic: str, record: dict) -> None:
        self.sent.append(record)


def test_the_job_reports_every_finished_batch_once_and_in_order(caplog):
    import logging
    from types import SimpleNamespace

    from electra.streaming.job import ProgressLog

    sink = SimpleNamespace(output=_Output(), dead_letters_total=0, proposals_total=1,
                           take=lambda b: {"proposals": 1, "dead_letters": 0, "liveness": 3, "sink_ms": 2.0,
                                           "collect_ms": 9.0} if b == 1 else None)
    progress, query = ProgressLog(sink, "stats"), _Query()
    with caplog.at_level(logging.INFO, logger="electra.streaming.job"):
        progress.poll(query)  # nothing finished yet
        query.finish(0)
        progress.poll(query)
        progress.poll(query)  # the same batch again: not reported twice
        for b in (1, 2, 3):  # three batches between two polls
            query.finish(b)
        progress.poll(query)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch=")]
    assert [int(x.split()[0].removeprefix("batch=")) for x in lines] == [0, 1, 2, 3]
    assert "proposals=1 " in lines[1] and "liveness=3 " in lines[1]
    assert "phases=addBatch:60,state_update:5,state_commit:7,state_rows:1" in lines[0]
    assert [r["batchId"] for r in sink.output.sent] == [0, 1, 2, 3]
    assert sink.output.sent[3]["consumed"] == {"electra.heartbeats:0": 3}


def test_a_batch_reported_after_an_idle_trigger_with_its_id_is_not_lost(caplog):
    """Spark reports a trigger without new records under the id of the batch still to run; that batch's own
    report (same id, later timestamp) must still be logged and sent, with what the batch's sink did."""
    import logging
    from types import SimpleNamespace

    from electra.streaming.job import ProgressLog

    sink = SimpleNamespace(output=_Output(), dead_letters_total=0, proposals_total=3,
                           take=lambda b: {"proposals": 3, "dead_letters": 0, "liveness": 4, "sink_ms": 1.0,
                                           "collect_ms": 1.0})
    progress, query = ProgressLog(sink, "stats"), _Query()
    query.recentProgress.append({"batchId": 5, "timestamp": "2026-11-23T16:50:41.000Z", "numInputRows": 0})
    with caplog.at_level(logging.INFO, logger="electra.streaming.job"):
        progress.poll(query)
        query.recentProgress.append({"batchId": 5, "timestamp": "2026-11-23T16:50:58.000Z", "numInputRows": 15,
                                     "batchDuration": 4000})
        progress.poll(query)
        progress.poll(query)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch=5 ")]
    assert len(lines) == 2 and "rows=15 proposals=3 " in lines[1]
    assert [r["rows"] for r in sink.output.sent] == [0, 15]

"""The streaming job's batch report: one small record per micro-batch on the job-stats topic.

Controllers do not see the Spark job; the dashboard does through this topic (one
partition, newest record wins): which batch ran, its rows and duration, what it sent
(proposals, liveness, dead letters) and the Kafka offsets it has consumed up to, from
which a node computes the job's consumer lag against the topics' end offsets (Structured
Streaming keeps those offsets in its checkpoint, not in a Kafka consumer group).
"""

from __future__ import annotations

import json
from typing import Any


def _get(obj: Any, name: str) -> Any:
    """A progress field, from Spark's progress JSON (a dict) or from PySpark's progress objects."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def consumed_offsets(sources: list[Any]) -> dict[str, int]:
    """`{"topic:partition": next offset}` the batch read up to, summed over the query's sources.

    A source's `endOffset` is JSON text: `{"topic:partition": n}` from Electra's Python source,
    `{"topic": {"partition": n}}` from Spark's Kafka connector; anything else is skipped.
    """
    out: dict[str, int] = {}
    for src in sources or []:
        try:
            end = _get(src, "endOffset")
            end = json.loads(end) if isinstance(end, str) else end
        except (TypeError, ValueError):
            continue
        for key, value in (end or {}).items():
            if isinstance(value, dict):
                out.update({f"{key}:{p}": int(n) for p, n in value.items()})
            elif isinstance(value, int):
                out[key] = value
    return out


def batch_record(progress: Any, sink_stats: dict, dead_letters_total: int, proposals_total: int,
                 now_ms: int) -> dict:
    """The job-stats record of one finished batch (`progress`: Spark's StreamingQueryProgress, as JSON or object)."""
    return {"batchId": _get(progress, "batchId"), "rows": _get(progress, "numInputRows"),
            "batchMs": _get(progress, "batchDuration"),
            "proposals": sink_stats.get("proposals", 0), "liveness": sink_stats.get("liveness", 0),
            "deadLetters": sink_stats.get("dead_letters", 0), "deadLettersTotal": dead_letters_total,
            "proposalsTotal": proposals_total, "consumed": consumed_offsets(_get(progress, "sources")), "ts": now_ms}

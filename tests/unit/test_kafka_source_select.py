"""Source selection: `auto` falls back to the Python data source when Spark's Kafka connector is missing."""

from __future__ import annotations

import pytest

from electra.streaming.kafka_source import NAME, KafkaDataSource, builtin_kafka_available, load_kafka_stream


class FakeReader:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def format(self, fmt: str) -> FakeReader:
        self.calls.append(("format", fmt))
        return self

    def option(self, k: str, v: str) -> FakeReader:
        self.calls.append(("option", k, v))
        return self

    def load(self) -> str:
        return "df"


class FakeRegistry:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def register(self, cls) -> None:
        self.calls.append(("register", cls))


class FakeSpark:
    """No `_jvm` (like a Spark Connect session): the built-in connector cannot be checked."""

    def __init__(self) -> None:
        self.calls: list = []
        self.readStream = FakeReader(self.calls)
        self.dataSource = FakeRegistry(self.calls)


def test_auto_falls_back_to_the_python_source():
    spark = FakeSpark()
    assert builtin_kafka_available(spark) is False
    df, used = load_kafka_stream(spark, "127.0.0.1:9092", ["a", "b"], "auto", hwm_fix=True)
    assert (df, used) == ("df", "python")
    assert ("register", KafkaDataSource) in spark.calls and ("format", NAME) in spark.calls
    opts = {c[1]: c[2] for c in spark.calls if c[0] == "option"}
    assert opts == {"bootstrap": "127.0.0.1:9092", "topics": "a,b", "hwmFix": "true", "startingOffsets": "earliest",
                    "readTasks": "0"}


def test_explicit_python_and_bad_choice():
    spark = FakeSpark()
    assert load_kafka_stream(spark, "h:1", ["a"], "python", hwm_fix=False)[1] == "python"
    assert ("option", "hwmFix", "false") in spark.calls
    with pytest.raises(ValueError):
        load_kafka_stream(spark, "h:1", ["a"], "flink")

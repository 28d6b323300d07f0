"""Kafka TLS/SASL settings: parsed in one place and handed to every Kafka client Electra creates.

Each client factory is exercised with kafka-python's classes replaced by a recorder that stops the
code right after the constructor call, so the test sees the exact keyword arguments every producer,
consumer and admin client gets (tansu, the embedded broker, has no SASL to test against)."""

from __future__ import annotations

import asyncio

import kafka
import pytest

from electra.security.kafka_settings import KafkaSecurity

SASL_ENV = {"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "ELECTRA_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "ELECTRA_KAFKA_SASL_USERNAME": "electra", "ELECTRA_KAFKA_SASL_PASSWORD": 's3"cret',
            "ELECTRA_KAFKA_CA_FILE": "/etc/kafka/ca.pem"}
EXPECTED = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "electra",
            "sasl_plain_password": 's3"cret', "ssl_cafile": "/etc/kafka/ca.pem"}


class _Made(BaseException):  # BaseException: the retry loops around the constructors do not swallow it
    pass


@pytest.fixture
def made(monkeypatch):
    for k, v in SASL_ENV.items():
        monkeypatch.setenv(k, v)
    calls: list[tuple[str, dict]] = []

    def recorder(kind):
        def make(*args, **kwargs):
            calls.append((kind, kwargs))
            raise _Made(kind)
        return make

    import electra.api.kafka_bridge as bridge
    import electra.streaming.kafka_io as kafka_io

    for kind in ("KafkaProducer", "KafkaConsumer"):
        monkeypatch.setattr(kafka, kind, recorder(kind))
        monkeypatch.setattr(bridge, kind, recorder(kind))
    monkeypatch.setattr(kafka_io, "KafkaAdminClient", recorder("KafkaAdminClient"))
    return calls


def _settings_reach(calls, n):
    assert len(calls) == n, calls
    for kind, kwargs in calls:
        for key, value in EXPECTED.items():
            assert kwargs.get(key) == value, (kind, key, kwargs)


def test_settings_parse_and_validate():
    s = KafkaSecurity.from_env(SASL_ENV)
    assert s.client_kwargs() == EXPECTED
    opts = s.spark_options()
    assert opts["kafka.security.protocol"] == "SASL_SSL" and opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                              'username="electra" password="s3\\"cret";')
    assert opts["kafka.ssl.truststore.location"] == "/etc/kafka/ca.pem"
    assert KafkaSecurity.from_env({}).client_kwargs() == {} and KafkaSecurity.from_env({}).spark_options() == {}
    with pytest.raises(ValueError, match="SECURITY_PROTOCOL"):
        KafkaSecurity.from_env({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(ValueError, match="SASL_MECHANISM"):
        KafkaSecurity.from_env({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    with pytest.raises(ValueError, match="USERNAME"):
        KafkaSecurity.from_env({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                "ELECTRA_KAFKA_SASL_MECHANISM": "PLAIN"})


def test_every_kafka_client_gets_the_settings(made):
    from electra.api.ingest import HeartbeatProducer
    from electra.api.kafka_bridge import EventsPublisher, LivenessConsumer
    from electra.streaming.kafka_io import ensure_topics
    from electra.streaming.kafka_source import KafkaPartition, KafkaStreamReader, read_partition
    from electra.streaming.records import Topics
    from electra.streaming.sink import KafkaOutput

    attempts = [
        lambda: HeartbeatProducer("k:9092")._connect_loop(),  # ingest workers and the node's heartbeat producer
        lambda: EventsPublisher(None, "k:9092", Topics())._last_published_index(),  # node: events tail
        lambda: LivenessConsumer(None, "k:9092")._follow(),  # node: liveness consumer
        lambda: ensure_topics("k:9092", {"t": 1}, timeout_s=1),  # topic creation (stack, node, job)
        lambda: KafkaOutput("k:9092", "l", "d")._get(),  # the job's liveness and dead-letter producer
        lambda: KafkaStreamReader({"bootstrap": "k:9092", "topics": "t"})._probe(),  # the job's offsets probe
        lambda: list(read_partition(KafkaPartition("t", 0, 0, 1, "k:9092", 1000))),  # the job's executors
    ]
    for attempt in attempts:
        with pytest.raises(_Made):
            attempt()
    # the events publisher's producer, created when the node leads
    import electra.api.kafka_bridge as bridge

    pub = EventsPublisher(None, "k:9092", Topics())
    bridge_ensure = bridge.ensure_topics
    bridge.ensure_topics = lambda *a, **k: None
    try:
        with pytest.raises(_Made):
            asyncio.run(pub._lead(1))
    finally:
        bridge.ensure_topics = bridge_ensure
    _settings_reach(made, 8)


def test_spark_kafka_connector_gets_the_options(monkeypatch):
    for k, v in SASL_ENV.items():
        monkeypatch.setenv(k, v)
    from electra.streaming import kafka_source

    seen: dict = {}

    class Reader:
        def format(self, _):
            return self

        def option(self, k, v):
            seen[k] = v
            return self

        def options(self, **kw):
            seen.update(kw)
            return self

        def load(self):
            return self

        def selectExpr(self, *_):
            return self

    class Spark:
        readStream = Reader()

    kafka_source.load_kafka_stream(Spark(), "k:9092", ["t"], source="kafka")
    assert seen["kafka.security.protocol"] == "SASL_SSL" and "ScramLoginModule" in seen["kafka.sasl.jaas.config"]

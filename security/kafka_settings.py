"""Kafka security settings (TLS, SASL), built in one place and passed through to every Kafka client.

Electra does not terminate Kafka's security; it hands the operator's settings to each client it
creates: the ingest workers' producers, the node's events publisher and liveness consumers, topic
creation, the Spark job's sources (kafka-python reader or Spark's own connector) and its sink.
Settings come from the environment, so every process of a deployment (node, ingest workers, the
job's driver and local executors) reads the same ones:

    ELECTRA_KAFKA_SECURITY_PROTOCOL   PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL
    ELECTRA_KAFKA_SASL_MECHANISM      PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    ELECTRA_KAFKA_SASL_USERNAME       SASL user
    ELECTRA_KAFKA_SASL_PASSWORD_FILE  file holding the SASL password (or ELECTRA_KAFKA_SASL_PASSWORD)
    ELECTRA_KAFKA_CA_FILE             PEM bundle that signed the Kafka brokers' certificates
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"ELECTRA_KAFKA_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}, "
                             f"not {self.protocol!r}")
        if self.sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ValueError(f"ELECTRA_KAFKA_SASL_MECHANISM must be one of {', '.join(MECHANISMS)} with "
                                 f"{self.protocol}, not {self.sasl_mechanism!r}")
            if not self.username or self.password is None:
                raise ValueError(f"{self.protocol} needs ELECTRA_KAFKA_SASL_USERNAME and a password")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def from_env(cls, env: dict | None = None) -> KafkaSecurity:
        env = os.environ if env is None else env
        password = env.get("ELECTRA_KAFKA_SASL_PASSWORD")
        if password is None and env.get("ELECTRA_KAFKA_SASL_PASSWORD_FILE"):
            try:
                password = Path(env["ELECTRA_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
            except OSError as exc:
                raise ValueError(f"cannot read ELECTRA_KAFKA_SASL_PASSWORD_FILE: {exc}") from None
        return cls(protocol=env.get("ELECTRA_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper(),
                   sasl_mechanism=env.get("ELECTRA_KAFKA_SASL_MECHANISM") or None,
                   username=env.get("ELECTRA_KAFKA_SASL_USERNAME") or None, password=password,
                   ca_file=env.get("ELECTRA_KAFKA_CA_FILE") or None)

    def client_kwargs(self) -> dict:
        """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
        if self.protocol == "PLAINTEXT":
            return {}
        kw: dict = {"security_protocol": self.protocol}
        if self.sasl:
            kw |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                   "sasl_plain_password": self.password}
        if self.tls and self.ca_file:
            kw["ssl_cafile"] = self.ca_file
        return kw

    def spark_options(self) -> dict[str, str]:
        """`kafka.*` options for Spark's Kafka connector (readStream.format("kafka"))."""
        if self.protocol == "PLAINTEXT":
            return {}
        opts = {"kafka.security.protocol": self.protocol}
        if self.sasl:
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if self.sasl_mechanism == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            user = self.username.replace("\\", "\\\\").replace('"', '\\"')
            pw = (self.password or "").replace("\\", "\\\\").replace('"', '\\"')
            opts |= {"kafka.sasl.mechanism": self.sasl_mechanism,
                     "kafka.sasl.jaas.config": f'{module} required username="{user}" password="{pw}";'}
        if self.tls and self.ca_file:
            opts |= {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": self.ca_file}
        return opts


def check_kafka_security(env: dict | None = None) -> KafkaSecurity:
    """The settings of the environment, checked as a command starts (ValueError with the variable to fix): an
    unknown protocol or mechanism, a password file or CA file that cannot be read. Found only inside the Kafka
    clients, each failed its attempts in a retry loop ("Kafka unreachable; retrying") without end."""
    security = KafkaSecurity.from_env(env)
    if security.tls and security.ca_file:
        try:
            with open(security.ca_file, "rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read ELECTRA_KAFKA_CA_FILE: {exc}") from None
    return security


def kafka_client_kwargs() -> dict:
    """The settings every kafka-python client in Electra is created with (read from the environment)."""
    return KafkaSecurity.from_env().client_kwargs()

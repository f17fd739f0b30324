"""Worker settings: environment variables (prefix ``PRIVGW_``) and CLI flags.

Every setting has an environment variable: ``bootstrap`` is ``PRIVGW_BOOTSTRAP``,
``sasl_password`` is ``PRIVGW_SASL_PASSWORD`` (or ``PRIVGW_SASL_PASSWORD_FILE``: a file holding
it). Secrets are ``SecretStr``: masked in ``repr`` and logs. The deployment secret that keys
pseudonyms and randomness is read separately by ``gateway.keyed.load_secret``
(``PRIVGW_SECRET`` / ``PRIVGW_SECRET_FILE``) and is not part of these settings.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.errors import PrivgwError
from gateway.policy import Policy, topic_clash
from gateway.shards import MAX_SHARDS

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's cpuset), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PRIVGW_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    # -- where ------------------------------------------------------------------------
    bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers host:port[,…]")
    group_id: str = "privgw"
    client_id: str = "privgw"
    input_topic: str | None = Field(None, description="overrides the policy's input.topic")
    output_topic: str | None = Field(None, description="overrides the policy's output.topic")
    dlq_topic: str | None = Field(None, description="default <input>.dlq")
    meta_topic: str | None = Field(None, description="default <output>.meta")
    partitions: int = Field(6, ge=1, description="partitions of topics this worker creates")
    replication_factor: int = Field(1, ge=1)
    create_topics: bool = Field(True, description="create missing topics at startup")
    state_dir: Path = Path("privgw-state")
    state_backend: Literal["sqlite", "partitioned"] = Field(
        "sqlite",
        description="sqlite: one file per worker; partitioned: one RocksDB per input "
        "partition with a changelog topic, restored when the partition is assigned",
    )

    rotate_secret: bool = Field(
        False,
        description="accept a state written with another deployment secret (key fingerprint): "
        "logs a privacy event and counts privgw_secret_rotations_total; without it such a "
        "state is refused",
    )

    engine: Literal["auto", "thread", "process"] = Field(
        "auto",
        description="process: the engine and its SQLite state in a child process, so that "
        "protection and the Kafka clients use two cores; thread: in the worker's process; "
        "auto: process with the sqlite backend on a machine with two cores or more",
    )
    engine_shards: int | None = Field(
        None,
        ge=1,
        le=MAX_SHARDS,
        description="respondents split over this many engines, each with a SQLite file of its "
        "own (one process each with engine process): a window's protection uses that many "
        "cores. Fixed for the life of a state dir; default: what the state dir holds, else 1",
    )

    # -- metrics ------------------------------------------------------------------------
    metrics_port: int = Field(9464, ge=0, le=65535, description="0 disables the exporter")
    metrics_host: str = "127.0.0.1"

    # -- transport security ----------------------------------------------------------------
    security_protocol: SecurityProtocol = "PLAINTEXT"
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_username_file: Path | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None

    # -- consumer group and batching ---------------------------------------------------------
    # Short session timeouts: a group join waits about half of it on the development broker.
    session_timeout_ms: int = Field(6000, ge=1000)
    heartbeat_interval_ms: int = Field(1000, ge=100)
    max_poll_interval_ms: int = Field(300_000, ge=1000)
    max_poll_records: int = Field(5000, ge=1)
    fetch_max_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_partition_fetch_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    linger_ms: int = Field(5, ge=0)
    max_batch_bytes: int = Field(1024 * 1024, ge=1024, description="producer batch size")
    request_timeout_ms: int = Field(30_000, ge=1000)
    # a Kafka broker answers metadata in milliseconds; an HTTP or silent port never does
    probe_timeout_s: float = Field(
        8.0, gt=0, le=120, description="startup check that --bootstrap is a Kafka broker"
    )

    # -- input limits and lifecycle ----------------------------------------------------------
    max_message_bytes: int = Field(1_048_576, ge=1)
    max_depth: int = Field(64, ge=1)
    shutdown_grace_seconds: float = Field(30.0, gt=0)
    # False: held records stay uncommitted for the next owner (DESIGN §6). True: the last
    # window before shutdown treats them as timed out (suppress or keep holding, per policy).
    flush_held_on_shutdown: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # -- static assignment (no group coordination): worker i of n takes p mod n == i ---------
    worker_index: int | None = Field(None, ge=0)
    workers: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.sasl_password is not None and self.sasl_password_file is not None:
            raise ValueError("set PRIVGW_SASL_PASSWORD or PRIVGW_SASL_PASSWORD_FILE, not both")
        if self.sasl_username is not None and self.sasl_username_file is not None:
            raise ValueError("set PRIVGW_SASL_USERNAME or PRIVGW_SASL_USERNAME_FILE, not both")
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if (self.worker_index is None) != (self.workers is None):
            raise ValueError("static assignment needs both worker_index and workers")
        if self.workers is not None and not 0 <= (self.worker_index or 0) < self.workers:
            raise ValueError(
                f"worker_index must be in 0..{self.workers - 1} for {self.workers} workers, "
                f"got {self.worker_index}"
            )
        if self.engine == "process" and self.state_backend != "sqlite":
            raise ValueError(
                "engine process needs state_backend sqlite (the partitioned backend writes "
                "its changelog through the worker's producer); set engine to thread or auto"
            )
        if (self.engine_shards or 1) > 1 and self.state_backend != "sqlite":
            raise ValueError(
                "engine_shards needs state_backend sqlite (the partitioned backend shards its "
                "state by input partition already); unset engine_shards"
            )
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        return self

    # -- derived -------------------------------------------------------------------------
    @property
    def engine_in_process(self) -> bool:
        """Whether the engine runs in a child process of its own (``engine``, resolved)."""
        if self.engine == "auto":
            return self.state_backend == "sqlite" and _usable_cpus() >= 2
        return self.engine == "process"

    def topics(self, policy: Policy) -> Topics:
        inp = self.input_topic or policy.input.topic
        out = self.output_topic or policy.output.topic
        topics = Topics(
            repartition=f"{inp}.repartition" if policy.input.key_field is not None else None,
            input=inp,
            output=out,
            dlq=self.dlq_topic
            or (policy.output.dlq_topic if self.input_topic is None else None)
            or f"{inp}.dlq",
            meta=self.meta_topic
            or (policy.output.meta_topic if self.output_topic is None else None)
            or f"{out}.meta",
        )
        # the policy checked its own topics; overrides (--input-topic, env) are checked here
        clash = topic_clash(
            [
                ("input topic (--input-topic / PRIVGW_INPUT_TOPIC / input.topic)", topics.input),
                (
                    "output topic (--output-topic / PRIVGW_OUTPUT_TOPIC / output.topic)",
                    topics.output,
                ),
                ("dead-letter topic (PRIVGW_DLQ_TOPIC / output.dlq_topic)", topics.dlq),
                ("metadata topic (PRIVGW_META_TOPIC / output.meta_topic)", topics.meta),
                *([("repartition topic", topics.repartition)] if topics.repartition else []),
            ]
        )
        if clash is not None:
            raise PrivgwError(clash)
        return topics

    @property
    def changelog_topic(self) -> str:
        """The partitioned backend's changelog: one partition per input partition."""
        return f"{self.group_id}.state-changelog"

    def static_partitions(self, partitions: Iterable[int]) -> list[int]:
        """This worker's share under static assignment: p mod workers == worker_index."""
        if self.workers is None or self.worker_index is None:
            raise ValueError("not in static assignment mode")
        return sorted(p for p in partitions if p % self.workers == self.worker_index)

    def sasl_credentials(self) -> tuple[str, str] | None:
        """(username, password) read from the settings or their files; None without SASL."""
        if self.sasl_mechanism is None:
            return None
        user = self.sasl_username
        if user is None and self.sasl_username_file is not None:
            user = _read_secret_file(self.sasl_username_file, "PRIVGW_SASL_USERNAME_FILE")
        if self.sasl_password is not None:
            password = self.sasl_password.get_secret_value()
        elif self.sasl_password_file is not None:
            password = _read_secret_file(self.sasl_password_file, "PRIVGW_SASL_PASSWORD_FILE")
        else:
            raise ValueError("SASL needs PRIVGW_SASL_PASSWORD or PRIVGW_SASL_PASSWORD_FILE")
        if not user:
            raise ValueError("SASL needs PRIVGW_SASL_USERNAME or PRIVGW_SASL_USERNAME_FILE")
        return user, password


class Topics:
    """The topics one worker touches."""

    __slots__ = ("dlq", "input", "meta", "output", "repartition")

    def __init__(
        self, *, input: str, output: str, dlq: str, meta: str, repartition: str | None = None
    ) -> None:
        self.input, self.output, self.dlq, self.meta = input, output, dlq, meta
        # where records without a key are re-keyed to (policy input.key_field), else None
        self.repartition = repartition

    def __repr__(self) -> str:
        return (
            f"Topics(input={self.input!r}, output={self.output!r}, dlq={self.dlq!r}, "
            f"meta={self.meta!r}, repartition={self.repartition!r})"
        )


def _read_secret_file(path: Path, variable: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{variable} cannot be read ({err.__class__.__name__}): {path}") from None
    return text.removesuffix("\n").removesuffix("\r")

"""Worker settings: environment variables (prefix ``PRIVGW_``) and CLI flags.

Every setting has an environment variable: ``bootstrap`` is ``PRIVGW_BOOTSTRAP``,
``sasl_password`` is ``PRIVGW_SASL_PASSWORD`` (or ``PRIVGW_SASL_PASSWORD_FILE``: a file holding
it). Secrets are ``SecretStr``: masked in ``repr`` and logs. The deployment secret that keys
pseudonyms and randomness is read separately by ``gateway.keyed.keyed.load_secret``
(``PRIVGW_SECRET`` / ``PRIVGW_SECRET_FILE``) and is not part of these settings.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.engine.shards import MAX_SHARDS
from gateway.errors import PrivgwError
from gateway.policy import Policy, TopicName, topic_clash

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's cpuset), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PRIVGW_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        allow_inf_nan=False,  # "inf" seconds: a stop or a stall that is never over
    )

    # -- where ------------------------------------------------------------------------
    bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers host:port[,…]")
    group_id: str = Field("privgw", description="consumer group of the workers")
    client_id: str = Field("privgw", description="client id the broker sees (logs, quotas)")
    input_topic: TopicName | None = Field(
        None,
        description="overrides the policy's input.topic; it must exist (never created: a "
        "typo would leave the worker idle)",
    )
    output_topic: TopicName | None = Field(None, description="overrides the policy's output.topic")
    dlq_topic: TopicName | None = Field(
        None,
        description="dead-letter topic (raw input bytes: same access control as the input); "
        "default the policy's dlq_topic, else <input>.dlq",
    )
    meta_topic: TopicName | None = Field(
        None, description="metadata topic; default the policy's meta_topic, else <output>.meta"
    )
    partitions: int = Field(
        6,
        ge=1,
        description="partitions of the topics this worker creates (output, DLQ; a repartition "
        "topic gets the input's)",
    )
    replication_factor: int = Field(
        3,
        ge=1,
        description="replication factor of the topics this worker creates; a cluster with "
        "fewer brokers gets its broker count, with a warning",
    )
    create_topics: bool = Field(
        True,
        description="create missing output, DLQ, meta, repartition and changelog topics at "
        "start (never the input topic); false: they must exist",
    )
    state_dir: Path = Field(Path("privgw-state"), description="state store directory")
    state_backend: Literal["sqlite", "partitioned"] = Field(
        "sqlite",
        description="sqlite: one file per worker; partitioned: one RocksDB per input "
        "partition with a changelog topic, restored when the partition is assigned",
    )

    policy_upgrade: str | None = Field(
        None,
        description="the policy version (16 hex digits) accepted as an upgrade of the policy "
        "the state was written under: the state is migrated at start (re-grouping, fresh "
        "draws; see privgw policy diff); a state written under another policy is refused "
        "without it",
    )
    allow_missing_partition_state: bool = Field(
        False,
        description="sqlite backend: accept input partitions whose records another worker "
        "protected (their state is in its state dir): their respondents are regrouped, with a "
        "warning naming them; without it the worker stops before processing them",
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

    # -- metrics, health and logs ------------------------------------------------------------
    metrics_port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="port of /metrics, /healthz and /readyz; 0 disables the exporter",
    )
    metrics_host: str = Field("127.0.0.1", description="address the exporter binds")
    stall_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="the worker counts as stalled (/healthz 503, privgw_stalled 1, a warning) "
        "when its loop has not turned, or a window has been in the engine, this long",
    )
    lag_interval_seconds: float = Field(
        5.0,
        gt=0,
        description="how often consumer lag is measured from the broker's end offsets and the "
        "group's committed offsets (apart from the processing loop)",
    )
    progress_interval_seconds: float = Field(
        60.0, ge=0, description="one INFO progress line per interval; 0: none"
    )
    input_idle_warning_seconds: float = Field(
        60.0,
        gt=0,
        description="warn once when the input topic still holds no record this long after start",
    )
    client_log_interval_seconds: float = Field(
        60.0,
        gt=0,
        description="Kafka client (aiokafka) warnings and errors, e.g. while the broker is "
        "away: the first is logged, the next ones of this period counted into one line",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="log level of the worker"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one readable line per event; json: one JSON object per line"
    )

    # -- transport security ----------------------------------------------------------------
    security_protocol: SecurityProtocol = Field(
        "PLAINTEXT", description="Kafka transport: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
    )
    ssl_cafile: Path | None = Field(None, description="CA bundle to verify the brokers")
    ssl_certfile: Path | None = Field(None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = Field(None, description="client private key (mutual TLS)")
    ssl_key_password: SecretStr | None = Field(None, description="password of the client key")
    ssl_check_hostname: bool = Field(True, description="check the broker's host name")
    sasl_mechanism: SaslMechanism | None = Field(
        None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (needed by SASL_*)"
    )
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_username_file: Path | None = Field(None, description="file holding the SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password")
    sasl_password_file: Path | None = Field(None, description="file holding the SASL password")

    # -- consumer group and batching ---------------------------------------------------------
    # Short session timeouts: a group join waits about half of it on the development broker.
    session_timeout_ms: int = Field(6000, ge=1000, description="consumer group session timeout")
    heartbeat_interval_ms: int = Field(
        1000, ge=100, description="group heartbeat; at most a third of the session timeout"
    )
    max_poll_interval_ms: int = Field(
        300_000, ge=1000, description="longest gap between fetches before the group evicts"
    )
    max_poll_records: int = Field(5000, ge=1, description="records per fetch call, at most")
    buffer_ahead_records: int = Field(
        100_000,
        ge=0,
        description="new records the worker may go on buffering past a due window while the "
        "engine protects the one before, when the policy groups whole releases "
        "(republication.pool: release); 0: it waits for the engine",
    )
    fetch_max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="bytes per fetch")
    max_partition_fetch_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="bytes per partition and fetch"
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="where a partition without a committed offset starts"
    )
    linger_ms: int = Field(5, ge=0, description="producer linger before sending a batch")
    max_batch_bytes: int = Field(1024 * 1024, ge=1024, description="producer batch size")
    request_timeout_ms: int = Field(30_000, ge=1000, description="Kafka request timeout")
    # a Kafka broker answers metadata in milliseconds; an HTTP or silent port never does
    probe_timeout_s: float = Field(
        8.0, gt=0, le=120, description="startup check that --bootstrap is a Kafka broker"
    )

    # -- input limits and lifecycle ----------------------------------------------------------
    max_message_bytes: int = Field(
        1_048_576, ge=1, description="larger input records are dead-lettered"
    )
    max_depth: int = Field(
        64,
        ge=1,
        le=512,  # the exact duplicate-key check recurses in Python: deeper, it could not run
        description="deepest JSON nesting accepted (at most 512)",
    )
    shutdown_grace_seconds: float = Field(
        30.0, gt=0, description="longest wait for the last window at shutdown"
    )
    # False: held records stay uncommitted for the next owner (DESIGN §6). True: the last
    # window before shutdown treats them as timed out (suppress or keep holding, per policy).
    flush_held_on_shutdown: bool = Field(
        False,
        description="at shutdown, treat records held for k as timed out (else they stay "
        "uncommitted for the next owner)",
    )

    # -- static assignment (no group coordination): worker i of n takes p mod n == i ---------
    worker_index: int | None = Field(
        None, ge=0, description="static assignment: this worker takes partitions p mod n = i"
    )
    workers: int | None = Field(None, ge=1, description="static assignment: number of workers n")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.sasl_password is not None and self.sasl_password_file is not None:
            raise ValueError("set PRIVGW_SASL_PASSWORD or PRIVGW_SASL_PASSWORD_FILE, not both")
        if self.sasl_username is not None and self.sasl_username_file is not None:
            raise ValueError("set PRIVGW_SASL_USERNAME or PRIVGW_SASL_USERNAME_FILE, not both")
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(
                f"PRIVGW_SECURITY_PROTOCOL {self.security_protocol} needs PRIVGW_SASL_MECHANISM"
            )
        if (self.worker_index is None) != (self.workers is None):
            raise ValueError(
                "static assignment needs both PRIVGW_WORKER_INDEX (--worker-index) and "
                "PRIVGW_WORKERS (--workers)"
            )
        if self.workers is not None and not 0 <= (self.worker_index or 0) < self.workers:
            raise ValueError(
                f"PRIVGW_WORKER_INDEX must be in 0..{self.workers - 1} for {self.workers} workers, "
                f"got {self.worker_index}"
            )
        if self.engine == "process" and self.state_backend != "sqlite":
            raise ValueError(
                "PRIVGW_ENGINE process needs PRIVGW_STATE_BACKEND sqlite (the partitioned backend "
                "writes its changelog through the worker's producer); set engine to thread or auto"
            )
        if (self.engine_shards or 1) > 1 and self.state_backend != "sqlite":
            raise ValueError(
                "PRIVGW_ENGINE_SHARDS needs PRIVGW_STATE_BACKEND sqlite (the partitioned backend "
                "shards its state by input partition already); unset engine_shards"
            )
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError(
                "PRIVGW_HEARTBEAT_INTERVAL_MS must be at most a third of PRIVGW_SESSION_TIMEOUT_MS"
            )
        return self

    # -- derived -------------------------------------------------------------------------
    @property
    def engine_in_process(self) -> bool:
        """Whether the engine runs in a child process of its own (``engine``, resolved)."""
        if self.engine == "auto":
            return self.state_backend == "sqlite" and usable_cpus() >= 2
        return self.engine == "process"

    def topics(self, policy: Policy) -> Topics:
        inp = self.input_topic or policy.input.topic
        out = self.output_topic or policy.output.topic
        topics = Topics(
            # re-keying (input.key_field), and the partitioned backend's re-routing of records
            # that arrived on a partition their key does not pick
            # (stream_jobs.partitions.state_routing)
            repartition=f"{inp}.repartition"
            if policy.input.key_field is not None or self.state_backend == "partitioned"
            else None,
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
                # reserved for the partitioned backend whichever backend runs now: a switch
                # later must not find raw records in it
                ("changelog topic (<--group-id>.state-changelog)", self.changelog_topic),
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


# Variables of the PRIVGW_ prefix that are not worker settings: the deployment secret, read by
# gateway.keyed.keyed.load_secret. Anything else with the prefix is a typo (check_environment).
OTHER_VARIABLES: dict[str, str] = {
    "PRIVGW_SECRET": "the deployment secret that keys pseudonyms and randomness (text, or "
    "hex:/base64: prefixed); set it or PRIVGW_SECRET_FILE",
    "PRIVGW_SECRET_FILE": "a file holding the deployment secret (mode 0600: a file readable "
    "by group or others is refused)",
    "PRIVGW_SECRET_FILE_SHARED": "1: accept a secret file readable by group or others, with a "
    "WARNING at every start (platforms that mount secrets that way)",
}

# settings that are also flags of `privgw run`
FLAGS: dict[str, str] = {
    "bootstrap": "--bootstrap",
    "group_id": "--group-id",
    "input_topic": "--input-topic",
    "output_topic": "--output-topic",
    "partitions": "--partitions",
    "state_dir": "--state-dir",
    "metrics_port": "--metrics-port",
    "worker_index": "--worker-index",
    "workers": "--workers",
    "state_backend": "--state-backend",
    "engine": "--engine",
    "engine_shards": "--engine-shards",
    "replication_factor": "--replication-factor",
    "create_topics": "--create-topics / --no-create-topics",
    "stall_timeout_seconds": "--stall-timeout-seconds",
    "log_format": "--log-format",
    "rotate_secret": "--rotate-secret",
    "allow_missing_partition_state": "--allow-missing-partition-state",
    "policy_upgrade": "--policy-upgrade",
}


def env_var(name: str) -> str:
    """The environment variable of setting ``name``."""
    return f"PRIVGW_{name.upper()}"


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse ``PRIVGW_*`` variables that are neither settings nor the secret's: a misspelt one
    would otherwise be ignored silently (a misspelt bootstrap variable left the default broker)."""
    known = {env_var(name) for name in WorkerSettings.model_fields} | set(OTHER_VARIABLES)
    for name in sorted(environ):
        if not name.startswith("PRIVGW_") or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}?" if close else "see docs/configuration.md"
        raise ValueError(f"unknown environment variable {name}: {hint} (or unset it)")


def _type_name(annotation: object) -> str:
    if typing.get_origin(annotation) is typing.Annotated:  # a checked type: the type it checks
        return _type_name(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(str(a) for a in args)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " \\| ".join(_type_name(a) for a in inner) + " (optional)"
    names = {str: "text", int: "integer", float: "number", bool: "true/false", Path: "path"}
    if annotation in names:
        return names[annotation]  # type: ignore[index]
    if annotation is SecretStr:
        return "secret"
    return getattr(annotation, "__name__", str(annotation))


def configuration_table() -> str:
    """The configuration reference in markdown, generated from the settings model
    (docs/configuration.md holds it; a test keeps the two equal)."""
    lines = [
        "| Environment variable | `privgw run` flag | Type | Default | Meaning |",
        "|---|---|---|---|---|",
    ]
    for name, field in WorkerSettings.model_fields.items():
        default = field.default
        shown = (
            "—"
            if default is None
            else str(default).lower()
            if isinstance(default, bool)
            else str(default)
        )
        flag = FLAGS.get(name)
        lines.append(
            f"| `{env_var(name)}` | {f'`{flag}`' if flag else ''} | "
            f"{_type_name(field.annotation)} | `{shown}` | {field.description or ''} |"
        )
    for name, doc in OTHER_VARIABLES.items():
        kind = "path" if name.endswith("_FILE") else "true/false" if "SHARED" in name else "secret"
        lines.append(f"| `{name}` |  | {kind} |  | {doc} (not a worker setting) |")
    return "\n".join(lines) + "\n"


def configuration_reference() -> str:
    """docs/configuration.md: regenerate it with ``python -m stream_jobs.settings``."""
    return (
        "# Configuration reference\n\n"
        "<!-- generated by `python -m stream_jobs.settings > docs/configuration.md` from "
        "stream_jobs/settings.py; tests/stream_jobs/test_configuration.py keeps them equal -->\n\n"
        "Every setting of `privgw run` is an environment variable; some are flags too (a flag "
        "wins over its variable). Another variable with the `PRIVGW_` prefix is an error that "
        "names the closest real one. Settings errors name the variable.\n\n" + configuration_table()
    )


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


if __name__ == "__main__":
    print(configuration_reference(), end="")

"""The Kafka commands of ``privgw``: ``run``, ``simulate`` and ``demo`` (and ``state-check``,
which reads a worker's state directory).

Registered through the ``privgw.commands`` entry point: ``gateway.commands.cli`` passes its argparse
subparsers to :func:`register`, so the pure engine never imports Kafka code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from gateway.commands.command_kit import add_command
from gateway.errors import PrivgwError
from gateway.policy import load_policy, topic_name_problem
from stream_jobs.shutdown import EXIT_BROKER_AWAY
from stream_jobs.worker_build import (
    build_worker,
    keyring_from_environment,
    worker_settings,
)

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    """The Kafka commands, on ``gateway.commands.cli``'s subparsers."""
    _register_run(sub)
    _register_simulate(sub)
    _register_demo(sub)
    _register_state_check(sub)
    from stream_jobs.commands.offsets_cli import register as register_offsets  # noqa: PLC0415
    from stream_jobs.commands.upgrade_cli import register as register_upgrades  # noqa: PLC0415
    from stream_jobs.intake.wave_control import register as register_wave  # noqa: PLC0415

    register_upgrades(sub)
    register_offsets(sub)
    register_wave(sub)


def _register_run(sub: Any) -> None:
    p = add_command(
        sub,
        "run",
        "run the streaming gateway: protect an input topic into an output topic",
        "privgw run --policy deploy/policies/adult.yaml --bootstrap 127.0.0.1:9092\n"
        "  PRIVGW_SECRET_FILE=secret.key privgw run --policy adult.yaml --embedded-broker",
    )
    p.add_argument("--policy", required=True, help="policy YAML")
    _kafka_options(p)
    _operation_options(p)
    _engine_options(p)
    p.set_defaults(func=cmd_run)


def _kafka_options(p: argparse.ArgumentParser) -> None:
    """Where the broker is and which topics the worker uses."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--bootstrap", help="Kafka bootstrap host:port (env PRIVGW_BOOTSTRAP)")
    where.add_argument(
        "--embedded-broker",
        action="store_true",
        help="start the development broker (memory only) on a free loopback port, with the "
        "input topic created",
    )
    p.add_argument("--group-id", help="consumer group (env PRIVGW_GROUP_ID, default privgw)")
    p.add_argument(
        "--input-topic",
        help="overrides the policy's input.topic; must exist (env PRIVGW_INPUT_TOPIC)",
    )
    p.add_argument(
        "--output-topic", help="overrides the policy's output.topic (env PRIVGW_OUTPUT_TOPIC)"
    )
    p.add_argument(
        "--partitions",
        type=int,
        help="partitions of topics created (env PRIVGW_PARTITIONS, default 6)",
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        help="replication factor of topics created, capped at the broker count "
        "(env PRIVGW_REPLICATION_FACTOR, default 3)",
    )
    p.add_argument(
        "--create-topics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create missing output, DLQ, meta and changelog topics; never the input "
        "(env PRIVGW_CREATE_TOPICS, default true)",
    )


def _operation_options(p: argparse.ArgumentParser) -> None:
    """State directory, metrics, stall detection, logs and static assignment."""
    p.add_argument("--state-dir", help="state store directory (env PRIVGW_STATE_DIR)")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="port of /metrics, /healthz, /readyz on PRIVGW_METRICS_HOST (127.0.0.1); 0 = off "
        "(env PRIVGW_METRICS_PORT, default 9464)",
    )
    p.add_argument(
        "--stall-timeout-seconds",
        type=float,
        help="stalled (/healthz 503) when the loop or a window in the engine makes no "
        "progress this long (env PRIVGW_STALL_TIMEOUT_SECONDS, default 30)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="log lines as text or one JSON object each (env PRIVGW_LOG_FORMAT)",
    )
    p.add_argument(
        "--worker-index",
        type=int,
        help="static assignment: this worker's index i (takes partitions p with p mod n = i; "
        "env PRIVGW_WORKER_INDEX)",
    )
    p.add_argument(
        "--workers", type=int, help="static assignment: number of workers n (env PRIVGW_WORKERS)"
    )


def _engine_options(p: argparse.ArgumentParser) -> None:
    """Where the engine runs and what its state may be."""
    p.add_argument(
        "--state-backend",
        choices=["sqlite", "partitioned"],
        help="sqlite (default): one file per worker; partitioned: state per input partition, "
        "with a changelog topic, restored when a partition is assigned "
        "(env PRIVGW_STATE_BACKEND)",
    )
    p.add_argument(
        "--engine",
        choices=["auto", "thread", "process"],
        help="where the engine runs: process (its own child process, a second core), thread "
        "(the worker's process), auto (default: process with sqlite state and 2+ cores; "
        "env PRIVGW_ENGINE)",
    )
    p.add_argument(
        "--engine-shards",
        type=int,
        help="respondents split over N engines, each with a state file of its own (N "
        "processes with --engine process): windows use N cores. Fixed for the life of a "
        "state dir (env PRIVGW_ENGINE_SHARDS; default: what the state dir holds, else 1)",
    )
    p.add_argument(
        "--rotate-secret",
        action="store_true",
        default=None,
        help="accept a state dir written with another secret (its key fingerprint differs): "
        "a privacy event, logged and counted; the new fingerprint is stored (env "
        "PRIVGW_ROTATE_SECRET)",
    )
    p.add_argument(
        "--allow-missing-partition-state",
        action="store_true",
        default=None,
        help="sqlite backend: accept partitions another worker processed (their state is "
        "elsewhere; their respondents are regrouped, with a warning); without it the worker "
        "stops (env PRIVGW_ALLOW_MISSING_PARTITION_STATE)",
    )
    p.add_argument(
        "--policy-upgrade",
        metavar="VERSION",
        help="accept this policy version as an upgrade of the one the state was written "
        "under, migrating the state at start (privgw policy diff shows what changes; env "
        "PRIVGW_POLICY_UPGRADE)",
    )


def _register_simulate(sub: Any) -> None:
    p = add_command(
        sub,
        "simulate",
        "send a simulated panel survey (UCI Adult answers) to a topic",
        "privgw simulate --bootstrap 127.0.0.1:9092 --topic survey.responses "
        "--rate 500/s --waves 5 --respondents 2000",
    )
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap (env PRIVGW_BOOTSTRAP)")
    p.add_argument(
        "--topic",
        default="survey.responses",
        help="the input topic to write to, keyed by respondent id (survey.responses)",
    )
    p.add_argument("--rate", default="0", help="records per second, e.g. 500/s (0 = max)")
    p.add_argument(
        "--waves", type=int, default=3, help="waves: each respondent answers once per wave (3)"
    )
    p.add_argument(
        "--respondents", type=int, default=1000, help="respondents in the first wave (1000)"
    )
    p.add_argument("--change-share", type=float, default=0.05, help="share changing per wave")
    p.add_argument("--new-share", type=float, default=0.05, help="new respondents per wave")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the simulation: same seed, same records (0)"
    )
    p.add_argument("--data", help="Adult CSV (default ../shared/data/adult.csv or bundled)")
    p.set_defaults(func=cmd_simulate)


def _register_demo(sub: Any) -> None:
    p = add_command(
        sub,
        "demo",
        "one-command demo: embedded broker + simulator + gateway, live summary, JSONL output",
        "privgw demo --records 20000",
    )
    p.add_argument("--records", type=int, default=20_000, help="records to publish (20000)")
    p.add_argument("--data-dir", default="privgw-data", help="where outputs go (privgw-data)")
    p.add_argument("--policy", help="policy (default deploy/policies/adult.yaml or bundled)")
    p.add_argument("--rate", default="5000", help="simulator records per second (5000)")
    p.add_argument("--waves", type=int, default=4, help="waves of the simulated panel (4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated panel (0)")
    p.set_defaults(func=cmd_demo)


def _register_state_check(sub: Any) -> None:
    p = add_command(
        sub,
        "state-check",
        "check (and with --repair rewrite) the group live counts in a worker's SQLite state",
        "privgw state-check --state-dir /var/lib/privgw/state\n"
        "  privgw state-check --state-dir /var/lib/privgw/state --repair   # worker stopped",
    )
    p.add_argument("--state-dir", help="the worker's state directory (env PRIVGW_STATE_DIR)")
    p.add_argument(
        "--repair",
        action="store_true",
        help="rewrite drifted counts; only with the worker stopped (it caches the file's keys)",
    )
    p.set_defaults(func=cmd_state_check)


# -- run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from stream_jobs.app import serve  # noqa: PLC0415
    from stream_jobs.commands.broker import EmbeddedBroker  # noqa: PLC0415
    from stream_jobs.commands.start_checks import start_checks  # noqa: PLC0415
    from stream_jobs.engine_process.engine_heartbeat import start_heartbeat  # noqa: PLC0415
    from stream_jobs.kafka import ensure_topics  # noqa: PLC0415
    from stream_jobs.ops.logs import configure_logging  # noqa: PLC0415
    from stream_jobs.ops.metrics import start_exporter  # noqa: PLC0415
    from stream_jobs.ops.monitor import start_monitor  # noqa: PLC0415

    policy = load_policy(args.policy)
    keyring = keyring_from_environment()
    broker = EmbeddedBroker() if args.embedded_broker else None
    with broker if broker is not None else contextlib.nullcontext():
        settings = worker_settings(
            bootstrap=broker.bootstrap if broker is not None else args.bootstrap,
            group_id=args.group_id,
            input_topic=args.input_topic,
            output_topic=args.output_topic,
            partitions=args.partitions,
            # one broker, memory only: replicas would be pointless
            replication_factor=args.replication_factor or (1 if broker is not None else None),
            create_topics=args.create_topics,
            state_dir=args.state_dir,
            metrics_port=args.metrics_port,
            stall_timeout_seconds=args.stall_timeout_seconds,
            log_format=args.log_format,
            worker_index=args.worker_index,
            workers=args.workers,
            state_backend=args.state_backend,
            engine=args.engine,
            engine_shards=args.engine_shards,
            rotate_secret=args.rotate_secret,
            allow_missing_partition_state=args.allow_missing_partition_state,
            policy_upgrade=args.policy_upgrade,
            **({"session_timeout_ms": 3000} if broker is not None else {}),
        )
        configure_logging(settings)
        topics = settings.topics(policy)
        if broker is not None:
            print(f"embedded broker on {broker.bootstrap} (memory only; log {broker.log_path})")
            # it starts empty: the input topic is created for the development loop only
            asyncio.run(ensure_topics(settings, topics, input_too=True, wait=policy.longest_wait))
        upgrade = start_checks(policy, settings, topics, keyring)
        worker = build_worker(policy, settings, keyring)
        worker.meta_extra = upgrade.announcement()
        worker.policy_events = upgrade.record.counts()
        worker.policy_record = upgrade.record
        _banner(worker, settings, keyring)
        monitor = start_monitor(worker, settings)
        start_heartbeat(worker, settings.stall_timeout_seconds)
        start_exporter(worker, settings, store=worker.state_store, monitor=monitor)
        t0 = time.monotonic()
        try:
            code = asyncio.run(serve(worker))
        finally:
            _summary(worker, time.monotonic() - t0)
        if worker.refused is not None:  # a partition's state holds another key fingerprint
            raise worker.refused
        return code


def _banner(worker: Any, settings: Any, keyring: Any) -> None:
    """The effective configuration, once at start (no secret: its fingerprint only)."""
    from gateway.commands.cli import package_version  # noqa: PLC0415

    t = worker.topics
    engine = "process" if settings.engine_in_process else "thread"
    log.info(
        "privgw %s: policy %s (%s); input %s, output %s, dlq %s, meta %s; group %s; "
        "state %s (%s backend, %d respondents restored); engine %s, %d shard(s); "
        "broker %s (%s); key fingerprint %s; metrics %s",
        package_version(),
        worker.policy.name or "unnamed",
        worker.engine.version,
        t.input,
        t.output,
        t.dlq,
        t.meta,
        settings.group_id,
        Path(settings.state_dir).resolve(),
        settings.state_backend,
        _respondents(worker.state_store),
        engine,
        worker.engine_shards,
        settings.bootstrap,
        settings.security_protocol,
        keyring.fingerprint(),
        f"http://{settings.metrics_host}:{settings.metrics_port}/metrics"
        if settings.metrics_port
        else "off",
    )


def _respondents(store: Any) -> int:
    from stream_jobs.ops.metrics import count_respondents  # noqa: PLC0415

    return count_respondents(store)


def _summary(worker: Any, elapsed: float) -> None:
    st = worker.stats
    log.info(
        "privgw stopped after %.0f s: %d records consumed, %d published (%d with "
        "quasi-identifiers suppressed), %d decided but not published (repeats of a published "
        "record), "
        "%d dead-lettered, %d windows, %d held records left uncommitted for the next run",
        elapsed,
        st.consumed,
        st.published,
        st.suppressed,
        st.withheld,
        st.dlq_total,
        st.windows,
        st.held,
    )


# -- simulate --------------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from stream_jobs.commands.simulator import PanelSurvey, load_rows, parse_rate  # noqa: PLC0415
    from stream_jobs.kafka import check_bootstrap  # noqa: PLC0415
    from stream_jobs.shutdown import BrokerAway  # noqa: PLC0415

    try:
        rate = parse_rate(args.rate)
    except ValueError:
        raise PrivgwError(
            f"--rate must be a number of records per second like 500/s, got {args.rate}"
        ) from None
    if (problem := topic_name_problem(args.topic)) is not None:
        raise PrivgwError(f"--topic {problem}")
    settings = worker_settings(bootstrap=args.bootstrap)
    rows = load_rows(args.data)
    try:
        survey = PanelSurvey(
            respondents=args.respondents,
            waves=args.waves,
            change_share=args.change_share,
            new_share=args.new_share,
            seed=args.seed,
            rows=rows,
        )
    except ValueError as err:  # "new_share must be …" -> "--new-share must be …"
        name, _, rest = str(err).partition(" ")
        raise PrivgwError(f"--{name.replace('_', '-')} {rest}") from None

    progress = [0]

    async def main() -> int:
        from stream_jobs.commands.simulator import simulate_to  # noqa: PLC0415

        await check_bootstrap(settings)
        return await simulate_to(
            settings, args.topic, survey.records(), rate=rate, progress=progress
        )

    try:
        sent = asyncio.run(main())
    except (KafkaError, BrokerAway):  # the broker went away mid-run (it was there at the start)
        print(
            f"privgw: error: the broker at {settings.bootstrap} stopped answering after "
            f"{progress[0]} records were handed to the producer; "
            f"the latest of them may be missing from {args.topic}: run simulate again once "
            "the broker is back",
            file=sys.stderr,
        )
        return EXIT_BROKER_AWAY
    print(f"sent {sent} records to {args.topic} ({args.waves} waves, key = respondent_id)")
    return 0


# -- demo ----------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from stream_jobs.commands.demo import run_demo  # noqa: PLC0415

    return run_demo(
        records=args.records,
        data_dir=Path(args.data_dir),
        policy_path=args.policy,
        rate=args.rate,
        waves=args.waves,
        seed=args.seed,
    )


# -- state-check ---------------------------------------------------------------------------
def cmd_state_check(args: argparse.Namespace) -> int:
    """Exit 0: consistent (or repaired); 1: drifted counts found and left as they are."""
    from state.layout import Backend, shard_paths, stored_backend, stored_shards  # noqa: PLC0415
    from state.sqlite_store import SQLiteStore  # noqa: PLC0415

    settings = worker_settings(state_dir=args.state_dir)
    state_dir = Path(settings.state_dir)
    if stored_backend(state_dir) is Backend.PARTITIONED:
        raise PrivgwError(
            f"--state-dir {state_dir} holds the partitioned backend's state: it lives in the "
            "changelog topic (<group>.state-changelog), and partitions/ is rebuilt from it "
            "at every assignment, so there is no file to check here; state-check audits the "
            "sqlite backend's state files"
        )
    shards = stored_shards(state_dir)
    if shards is None:
        raise PrivgwError(
            f"--state-dir: no state file in {state_dir}; give the directory the worker's "
            "--state-dir / PRIVGW_STATE_DIR names (the sqlite backend)"
        )
    # a group and all its members live in one shard's file: each file is audited alone
    status = 0
    for path in shard_paths(state_dir, shards):
        try:
            with SQLiteStore(path) as store:
                status = max(status, _check_store(store, path, repair=args.repair))
        except sqlite3.DatabaseError as err:  # not a database, or a damaged one
            raise PrivgwError(
                f"--state-dir: {path} is not a readable privgw state database "
                f"({err.__class__.__name__}); give the worker's state directory, or restore "
                "the file from a backup"
            ) from None
    return status


def _check_store(store: Any, path: Path, *, repair: bool) -> int:
    from gateway.errors import StateDamagedError  # noqa: PLC0415
    from gateway.panel.roster import roster_last_wave, roster_members  # noqa: PLC0415
    from gateway.state_store.live_counts import audit_live_counts  # noqa: PLC0415

    audit = audit_live_counts(store.items())
    print(f"{audit.respondents} respondents, {audit.groups} groups in {path}")
    if members := roster_members(store.get_many, [None]):
        try:  # its parts read back and checked against its head, as the worker reads them
            roster_last_wave(store.get_many, None)
        except StateDamagedError as err:
            raise StateDamagedError(f"{path}: {err}") from None
        print(f"{members} panel members in its roster (a panel keeps no live counts to audit)")
    if audit.consistent:
        print("live counts: consistent")
        return 0
    off = sum(abs(stored - actual) for stored, actual in audit.drifted.values())
    print(f"live counts differ from the members in {_groups(len(audit.drifted))} (by {off} in all)")
    if not repair:
        print("run again with --repair, with the worker stopped, to rewrite them")
        return 1
    store.put_many(audit.repairs())
    print(f"rewrote the live counts of {_groups(len(audit.drifted))}")
    return 0


def _groups(n: int) -> str:
    return f"{n} group" if n == 1 else f"{n} groups"

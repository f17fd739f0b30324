"""A worker assembled from its settings: where the engine runs and where its state lives.

- the partitioned backend (RocksDB, the ``rocksdb`` extra): one store whose partitions follow
  the consumer's, the engine in the worker's thread (its changelog goes through the worker's
  producer); partitions are restored and checked as they are assigned
  (``stream_jobs.partitions.rebalancing``);
- the sqlite backend: one SQLite file per engine shard (``state.layout``), the engine in a child
  process (``stream_jobs.engine_process.engine_process``; ``EngineShards`` for several) or in the
  worker's thread (``gateway.engine.shards.ShardedEngine`` for several); the state's key fingerprint
  is checked here, before the worker starts, and the partition-state guard set up.

The settings (environment and flags) and the keyring it is built from are read here too, each
refused in one line that names the setting. Kafka, the state backends and the worker are
imported when a worker is built, so that ``privgw --help`` stays light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gateway.errors import PrivgwError
from gateway.panel.roster import roster_last_wave, roster_members
from gateway.policy import Policy


def keyring_from_environment() -> Any:
    """The deployment secret's keyring (PRIVGW_SECRET or PRIVGW_SECRET_FILE)."""
    from gateway.keyed.keyed import Keyring, load_secret  # noqa: PLC0415

    return Keyring(load_secret(os.environ))


def worker_settings(**overrides: Any) -> Any:
    """The worker's settings from the environment and the flags given (``overrides``; None:
    not given), refused in one line naming the variable (and flag) and the fix."""
    from pydantic import ValidationError  # noqa: PLC0415

    from stream_jobs.settings import (  # noqa: PLC0415
        FLAGS,
        WorkerSettings,
        check_environment,
        env_var,
    )

    try:
        check_environment(os.environ)
        return WorkerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:

        def where(loc: tuple[Any, ...]) -> str:
            if not loc:
                return ""
            name = str(loc[0])
            flag = f" ({FLAGS[name]})" if name in FLAGS and overrides.get(name) is not None else ""
            return f"{env_var(name)}{flag}: "

        problems = "; ".join(
            f"{where(e['loc'])}{e['msg'].removeprefix('Value error, ')}"
            for e in err.errors(include_url=False, include_input=False)
        )
        raise PrivgwError(f"invalid settings: {problems}") from None
    except ValueError as err:
        raise PrivgwError(str(err)) from None


def build_worker(policy: Policy, settings: Any, keyring: Any) -> Any:
    """Engine (keyed, with the durable state store) + worker for ``policy``."""
    from gateway.engine.engine import Engine  # noqa: PLC0415
    from gateway.engine.shards import ShardedEngine  # noqa: PLC0415
    from gateway.state_store.state_api import check_key_fingerprint  # noqa: PLC0415
    from state.layout import resolve_shards, shard_paths  # noqa: PLC0415
    from state.sqlite_store import SQLiteStore  # noqa: PLC0415
    from stream_jobs.worker import GatewayWorker  # noqa: PLC0415

    engine: Any
    store: Any  # what the worker closes at the end and the exporter counts
    state_dir = Path(settings.state_dir)
    paths = [state_dir / "partitions"]  # the partitioned backend: one store, no shards
    if settings.state_backend == "partitioned":
        require_rocksdb()
        from state.partitioned_store import PartitionedStore  # noqa: PLC0415

        store = PartitionedStore(paths[0])
        engine = Engine(policy, keyring=keyring, store=store, partition_scope=True)
    else:
        paths = shard_paths(state_dir, resolve_shards(state_dir, settings.engine_shards))
        if settings.engine_in_process:
            from stream_jobs.engine_process.engine_process import (  # noqa: PLC0415
                EngineProcess,
                EngineShards,
                EngineSpec,
            )

            # engines and stores in children: they count their stores and close both
            specs = [EngineSpec(policy, path, keyring.reveal()) for path in paths]
            engine = store = EngineProcess(specs[0]) if len(specs) == 1 else EngineShards(specs)
        elif len(paths) == 1:
            store = SQLiteStore(paths[0])
            engine = Engine(policy, keyring=keyring, store=store)
        else:
            stores = [SQLiteStore(path) for path in paths]
            store = _Stores(stores)
            engine = ShardedEngine(
                [Engine(policy, keyring=keyring, store=s, measure_risk=False) for s in stores]
            )
    worker = GatewayWorker(policy, settings, engine)
    worker.key_fingerprint = keyring.fingerprint()
    if settings.state_backend != "partitioned":  # partitions are checked as they are assigned
        from stream_jobs.partitions.partition_state import PartitionStateGuard  # noqa: PLC0415

        try:
            outcome = check_key_fingerprint(
                store, worker.key_fingerprint, rotate=settings.rotate_secret, where=str(state_dir)
            )
            # state per worker: a partition that arrives without it stops the worker
            worker.partition_guard = PartitionStateGuard(
                state_dir,
                allow_missing=settings.allow_missing_partition_state,
                has_state=store.count() > 0,
            )
        except BaseException:
            store.close()
            raise
        worker.key_fingerprint_checked(outcome, str(state_dir))
    worker.closers.append(store.close)
    worker.state_store = store
    worker.engine_shards = len(paths)
    return worker


def require_rocksdb() -> None:
    """The partitioned backend's RocksDB binding is an optional extra: say which."""
    try:
        import rocksdict  # noqa: F401, PLC0415
    except ImportError:
        raise PrivgwError(
            "--state-backend partitioned (PRIVGW_STATE_BACKEND) needs the 'rocksdb' extra: "
            "pip install 'privgw[rocksdb]', or use the default sqlite backend"
        ) from None


class _Stores:
    """The shards' stores in this process, counted and closed as one (the thread engine)."""

    def __init__(self, stores: list[Any]) -> None:
        self.stores = stores

    def count_prefix(self, prefix: bytes) -> int:
        return sum(s.count_prefix(prefix) for s in self.stores)

    def count(self) -> int:
        return sum(s.count() for s in self.stores)

    def panel_members(self) -> int:
        return sum(roster_members(s.get_many, [None]) for s in self.stores)

    def panel_last_wave(self) -> int | None:  # of the shards that decided one
        waves = (roster_last_wave(s.get_many, None) for s in self.stores)
        return min((w for w in waves if w is not None), default=None)

    def key_fingerprints(self) -> list[str | None]:
        return [f for s in self.stores for f in s.key_fingerprints()]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        for s in self.stores:
            s.set_key_fingerprint(fingerprint)

    def rotate_key_fingerprint(self, fingerprint: str) -> int:
        return sum(s.rotate_key_fingerprint(fingerprint) for s in self.stores)

    def close(self) -> None:
        for s in self.stores:
            s.close()

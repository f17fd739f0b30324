"""Rebalancing: partitions assigned and revoked, and the state that comes with them.

The worker's consumer group moves partitions between members; this listener keeps the window
and the state in step with it:

- revoked: everything buffered is protected and its outputs settled and committed before the
  partitions go (the held records of revoked partitions are handed over uncommitted); the
  partitioned backend closes the state partitions no longer owned;
- assigned: with the sqlite backend, a partition whose state lives in another worker's state
  directory stops the worker (``stream_jobs.partitions.partition_state``); with the partitioned
  backend, each new state partition is rebuilt from its changelog before any of its records is
  processed, and its key fingerprint checked against the secret's. A restore that fails halts
  the worker: nothing more is protected, published or committed.

Every rebalance moves the ``epoch``: a batch fetched across one may come from before it, so the
worker drops it and puts its partitions back to their committed offsets
(:meth:`Rebalancing.rewind_to_committed`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition

from gateway.errors import PrivgwError
from gateway.state_store.state_api import (
    KeyFingerprintResult,
    SecretMismatchError,
    check_key_fingerprint,
)
from stream_jobs.delivery.delivery import Delivery
from stream_jobs.intake.intake import Intake, seek_back
from stream_jobs.ops.worker_stats import WorkerStats
from stream_jobs.partitions.changelog import RestoreError, restore_partitions
from stream_jobs.partitions.partition_state import PartitionStateGuard
from stream_jobs.secret.draw_settle import check_partitions
from stream_jobs.settings import Topics, WorkerSettings
from stream_jobs.windows.window_lifecycle import WindowLifecycle
from stream_jobs.windows.windows import FlushReason, WindowBuffer

if TYPE_CHECKING:  # the partitioned backend needs the rocksdb extra: imported when chosen
    from state.partitioned_store import PartitionedStore

log = logging.getLogger(__name__)


def is_partitioned(store: object) -> bool:
    """Whether ``store`` is the partitioned backend, without importing it (rocksdict is an
    optional extra: a plain install runs the sqlite backend)."""
    module = sys.modules.get("state.partitioned_store")
    return module is not None and isinstance(store, module.PartitionedStore)


class RebalancedWorker(Protocol):
    """What the listener reads and drives of the worker (``stream_jobs.worker.GatewayWorker``):
    its window lifecycle, delivery and intake, its state, and its stop."""

    settings: WorkerSettings
    topics: Topics
    stats: WorkerStats
    state_store: Any
    engine: Any  # under the partitioned backend, the in-process Engine (forget_partition)
    key_fingerprint: str | None
    refused: PrivgwError | None
    policy_record: Any
    intake: Intake
    delivery: Delivery
    lifecycle: WindowLifecycle

    @property
    def partition_guard(self) -> PartitionStateGuard | None: ...

    def request_stop(self) -> None: ...

    def key_fingerprint_checked(self, result: KeyFingerprintResult, where: str) -> None: ...


class Rebalancing(ConsumerRebalanceListener):  # type: ignore[misc]
    """The worker's rebalance listener. ``consumer`` once it exists; ``lock`` is the worker's
    (no window runs while partitions move); ``halted`` once a state could not be restored."""

    def __init__(self, worker: RebalancedWorker, lock: asyncio.Lock, buffer: WindowBuffer) -> None:
        self._worker = worker
        self._lock = lock
        self._buffer = buffer
        self.consumer: Any = None
        self.epoch = 0  # moves at every rebalance: a batch fetched across one is dropped
        self.halted = False  # a partition's state could not be restored (_halt)

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        async with self._lock:
            self.epoch += 1
            if self._worker.lifecycle.has_pending():
                await self._worker.lifecycle.flush(FlushReason.REVOKE)
            await self._worker.delivery.settled()  # commit what was flushed before handing over
            handed = self._buffer.forget((tp.topic, tp.partition) for tp in revoked)
            self._close_revoked_state(revoked)
            for tp in revoked:
                self._worker.stats.lag.pop((tp.topic, tp.partition), None)
            if handed:
                log.info("revoked %d partitions; %d held records handed over", len(revoked), handed)

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self.epoch += 1
        log.info("assigned %d partitions of %s", len(assigned), self._worker.topics.input)
        store = self._worker.state_store
        if not is_partitioned(store):
            self._warn_shared_group(assigned)
            await self._guard_partitions(assigned)
            return
        # The state of a partition is rebuilt from its changelog before any of its records is
        # processed: under the lock, so no window runs meanwhile, and the epoch moves again
        # after it, so a batch fetched during the restore is dropped and read again.
        async with self._lock:
            wanted = sorted({p for p in self._state_partitions(assigned)} - set(store.partitions))
            if wanted:
                t0 = time.perf_counter()
                try:
                    restored = await restore_partitions(
                        {p: store.open_partition(p, fresh=True) for p in wanted},
                        self._worker.settings,
                        self._worker.settings.changelog_topic,
                        progress=self._restore_progress,
                    )
                except Exception as err:
                    # the listener's exceptions are only logged by the client, which would go
                    # on consuming with a partial state: stop here, nothing protected after it
                    self._halt(err)
                    return
                log.info(
                    "restored the state of partitions %s: %d changelog records in %.1f s",
                    wanted,
                    restored,
                    time.perf_counter() - t0,
                )
                if self._worker.key_fingerprint is not None:
                    await self._check_key_fingerprint(store, wanted)
                await check_partitions(self._worker, store.view(wanted).stores, wanted)
                await self._migrate_policy(store, wanted)
            self.epoch += 1

    def _warn_shared_group(self, assigned: Sequence[TopicPartition]) -> None:
        """The sqlite backend in group mode with another member: it cannot fail over (issue
        45, item 8), so say so, with the fix, as soon as the group is shared."""
        s = self._worker.settings
        topic = self._worker.topics.input
        total = self.consumer.partitions_for_topic(topic) if self.consumer is not None else None
        mine = sum(1 for tp in assigned if tp.topic == topic)
        if s.workers is not None or not total or mine >= len(total):
            return
        log.warning(
            "%d of the %d partitions of %s are assigned here: another worker shares consumer "
            "group %s, and the sqlite state backend cannot fail over. When one of them stops, "
            "its partitions move to the others without their state, and those stop too (exit "
            "2, a partition without its state). Run several workers with --state-backend "
            "partitioned (PRIVGW_STATE_BACKEND; state follows partitions), or with static "
            "assignment (--workers N --worker-index I, each with its own --state-dir)",
            mine,
            len(total),
            topic,
            s.group_id,
        )

    async def _guard_partitions(self, assigned: Sequence[TopicPartition]) -> None:
        """Stop before processing partitions whose state is in another worker's state dir
        (stream_jobs.partitions.partition_state); a batch fetched meanwhile is dropped (the
        epoch)."""
        guard = self._worker.partition_guard
        if guard is None or self._worker.refused is not None:
            return
        refused = await guard.check(self.consumer, assigned)
        if refused is not None:
            log.error("%s", refused)
            self._worker.refused = refused
            self._worker.request_stop()

    async def _check_key_fingerprint(self, store: PartitionedStore, wanted: list[int]) -> None:
        """The restored partitions' key fingerprint against the secret's (off the loop: a
        fingerprint written goes through the changelog, which sends on the loop). Another one,
        without rotate_secret: stop before any of their records is processed."""
        assert self._worker.key_fingerprint is not None
        where = f"partitions {wanted} of {store.root}"
        check = functools.partial(
            check_key_fingerprint,
            store.view(wanted),
            self._worker.key_fingerprint,
            rotate=self._worker.settings.rotate_secret,
            where=where,
        )
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(None, check)
        except SecretMismatchError as err:
            log.error("%s", err)
            self._worker.refused = err
            self._worker.request_stop()
            return
        self._worker.key_fingerprint_checked(outcome, where)

    async def _migrate_policy(self, store: PartitionedStore, wanted: list[int]) -> None:
        """The restored partitions under the policy in force: an upgrade accepted on this
        state is applied to each (state.partition_policy; off the loop: its writes go through
        the changelog); a policy no upgrade leads to stops the worker before any record."""
        record = self._worker.policy_record
        if record is None or self._worker.refused is not None:
            return
        from state.partition_policy import migrate_partitions  # noqa: PLC0415

        where = f"partitions {wanted} of {store.root}"
        accepted = self._worker.settings.policy_upgrade == record.facets.version
        migrate = functools.partial(
            migrate_partitions, store.view(wanted).stores, record, accepted=accepted, where=where
        )
        try:
            report = await asyncio.get_running_loop().run_in_executor(None, migrate)
        except PrivgwError as err:
            log.error("%s", err)
            self._worker.refused = err
            self._worker.request_stop()
            return
        if report is not None:
            log.warning(
                "policy upgrade applied to %s (restored from %s): %s",
                where,
                self._worker.settings.changelog_topic,
                report.text(),
            )

    def _halt(self, err: Exception) -> None:
        """Stop before anything more is protected, published or committed (a state that could
        not be restored): the records buffered are left for the next run."""
        self.halted = True
        self.epoch += 1  # a batch fetched meanwhile is dropped
        if isinstance(err, PrivgwError):
            log.error("%s", err)
            self._worker.refused = err
        else:
            log.error("restoring the state failed (%s): stopping", err.__class__.__name__)
            self._worker.refused = RestoreError(
                f"restoring the state from {self._worker.settings.changelog_topic} failed "
                f"({err.__class__.__name__}); nothing was published"
            )
        self._worker.request_stop()

    def _restore_progress(self, remaining: int) -> None:
        self._worker.stats.restore_remaining = remaining
        self._worker.stats.loop_tick = time.monotonic()  # a long restore is progress, not a stall

    def _close_revoked_state(self, revoked: Sequence[TopicPartition]) -> None:
        store = self._worker.state_store
        if not is_partitioned(store):
            return
        gone = self._state_partitions(revoked)
        kept = self._state_partitions(set(self.consumer.assignment()) - set(revoked))
        # the in-process engine keeps panel rosters and states between windows: the next owner
        # writes them
        forget = getattr(self._worker.engine, "forget_partition", None)
        for partition in gone - kept:
            store.close_partition(partition)
            if forget is not None:
                forget(partition)

    def _state_partitions(self, tps: Iterable[TopicPartition]) -> set[int]:
        """The state partitions that come with ``tps``: those of the routing topic."""
        routing = self._worker.intake.routing
        return {tp.partition for tp in tps if routing is None or tp.topic == routing.topic}

    async def rewind_to_committed(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Put the partitions a batch fetched across a rebalance advanced back to their
        committed offsets (those still assigned), to be read again."""
        assigned = self.consumer.assignment()
        for tp in batch:
            if tp not in assigned:
                continue  # another member's now; it reads from the committed offset
            await seek_back(self.consumer, tp, self._worker.settings.auto_offset_reset)

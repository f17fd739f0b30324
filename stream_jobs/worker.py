"""The gateway worker: consume → validate → window → protect → produce → commit.

Batch-shaped on purpose (docs/streaming.md has the measurements): records are fetched with
aiokafka ``getmany`` (thousands per call), validated in one pass, protected a window at a
time by the pure engine, and produced with ``send_batch`` per partition. The worker runs as a
service inside a Faust app (``stream_jobs.app``) but does not use Faust's per-event streams.

Delivery (DESIGN §6): a flush produces the window's protected records and dead letters with
acks=all, awaits every acknowledgement, and only then commits, per partition, the offset of
the oldest record still held (or the next offset when none is held). A crash therefore
replays from the last commit, and replays are identical (deterministic record ids, state
written before output, keyed randomness).

The worker starts the clients, runs the loop and stops; each concern is a module of its own:
consuming and validation (``stream_jobs.intake.intake``), the window lifecycle from the buffer
through the engine (``stream_jobs.windows.window_lifecycle``; when a window closes:
``stream_jobs.windows.windows``), producing and committing (``stream_jobs.delivery.delivery``), and
rebalancing with the state that comes with each partition (``stream_jobs.partitions.rebalancing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition

from gateway.engine.routing import StatePartitions
from gateway.errors import PrivgwError
from gateway.policy import GroupingPool, Policy, RepublicationMode
from gateway.state_store.state_api import (
    KeyFingerprintCheck,
    KeyFingerprintResult,
    SecretMismatchError,
)
from stream_jobs.delivery.delivery import Delivery
from stream_jobs.delivery.meta import meta_message
from stream_jobs.engine_process.memory import Collector, tune_memory
from stream_jobs.intake.intake import Intake
from stream_jobs.intake.undecodable import UNDECODABLE, read_around
from stream_jobs.intake.wave_control import DecidedWaves, decided_wave
from stream_jobs.kafka import check_input_topic, ensure_topics, make_consumer, make_producer
from stream_jobs.ops.worker_stats import WorkerStats
from stream_jobs.partitions.changelog import KafkaChangelog
from stream_jobs.partitions.partition_state import PartitionStateGuard
from stream_jobs.partitions.rebalancing import Rebalancing, is_partitioned
from stream_jobs.partitions.state_routing import PartitionCountError, wire_routing
from stream_jobs.secret.draw_settle import settle_on_start
from stream_jobs.secret.secret_announce import announce_fingerprint, read_announced
from stream_jobs.settings import Topics, WorkerSettings
from stream_jobs.shutdown import (
    CLIENT_STOP_S,
    BrokerAway,
    StopDeadline,
    cancel_left_tasks,
    describe_uncommitted,
)
from stream_jobs.windows.window_lifecycle import (
    ProtectsWindows,
    WindowEngine,
    WindowLifecycle,
    WindowObserver,
)
from stream_jobs.windows.windows import TP, FlushReason, WindowBuffer

if TYPE_CHECKING:  # the partitioned backend needs the rocksdb extra: imported when chosen
    from state.partitioned_store import PartitionedStore

log = logging.getLogger(__name__)


class GatewayWorker:
    """One member of the gateway's consumer group."""

    def __init__(
        self,
        policy: Policy,
        settings: WorkerSettings,
        engine: WindowEngine | ProtectsWindows,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.engine = engine
        self.topics: Topics = settings.topics(policy)
        self.stats = WorkerStats()
        self.observers: list[WindowObserver] = []
        self.closers: list[Callable[[], None]] = []  # run after the clients are stopped
        self.state_store: Any = None  # the engine's store, for the metrics exporter
        self.engine_shards = 1  # engines the respondents are split over (gateway.engine.shards)
        self.key_fingerprint: str | None = None  # of the secret in force (Keyring.fingerprint)
        self.refused: PrivgwError | None = None  # why the worker stopped before processing
        # whether the broker answers (stream_jobs.ops.monitor's probe; a stop waits for it or not)
        self.broker_reachable: Callable[[], bool] = lambda: True
        self._deadline = StopDeadline()
        # offsets a stop without the broker left uncommitted: (first, next) per partition
        self.left_uncommitted: dict[TP, tuple[int, int]] = {}
        # the policy's history on this state (state.policy_record): upgrades by action, and
        # what the metadata topic announces about them
        self.policy_events: dict[str, int] = {}
        self.meta_extra: dict[str, object] = {}
        # the state directory's policy record (state.policy_record.PolicyRecord): the
        # partitioned backend migrates each restored partition to it (state.partition_policy)
        self.policy_record: Any = None
        self._clock = clock
        self._version = engine.version
        self._buffer = WindowBuffer.for_policy(policy)
        # a due window goes on buffering while the engine is busy only where a window's size
        # does not shape the groups: with pool: release a wave is grouped whole when it closes
        self._buffer_ahead = (
            settings.buffer_ahead_records
            if policy.republication.pool is GroupingPool.RELEASE
            else 0
        )
        self.intake = Intake(
            policy, settings, self.topics, engine.version, self._buffer, self.stats
        )
        if policy.republication.mode is RepublicationMode.PANEL:  # a restart's decided waves
            self.intake.wave_closes.decided = DecidedWaves(
                lambda scope: decided_wave(self.state_store, scope),
                scoped=lambda: is_partitioned(self.state_store),
            )
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._consumer: Any = None
        self._producer: Any = None
        self.delivery = Delivery(
            self.topics,
            engine.version,
            buffer=self._buffer,
            stats=self.stats,
            deadline=self._deadline,
            stopping=self._stopping,
        )
        self._rotation_counted = False  # this run's secret rotation is counted and logged
        self.ready = asyncio.Event()
        self.started = False  # clients up, topics checked (readiness, stream_jobs.ops.monitor)
        self._gc = Collector()
        self.rebalancing = Rebalancing(self, self._lock, self._buffer)
        self.lifecycle = WindowLifecycle(
            engine,
            self._buffer,
            self.intake,
            self.delivery,
            self.stats,
            self._gc,
            clock=clock,
            observers=self.observers,
            owned=self.assignment,
        )

    @property
    def partition_guard(self) -> PartitionStateGuard | None:
        """sqlite backend: whether assigned partitions come with their state (checked as they
        are assigned, and its ledger written before each commit)."""
        return self.delivery.partition_guard

    @partition_guard.setter
    def partition_guard(self, guard: PartitionStateGuard | None) -> None:
        self.delivery.partition_guard = guard

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        tune_memory()
        self._gc.start(time.monotonic())
        try:
            await self._start()
        except BaseException:  # a refused start leaves the process's collector as it was
            self._gc.stop()
            raise

    async def _start(self) -> None:
        s = self.settings
        await check_input_topic(s, self.topics)
        # (unless create_topics is off)
        await ensure_topics(s, self.topics, wait=self.policy.longest_wait)
        self._producer = make_producer(s)
        await self._producer.start()
        await self.delivery.open(self._producer)
        rekey = self.topics.repartition
        sources = [self.topics.input] + ([rekey] if rekey is not None else [])
        if is_partitioned(self.state_store):
            await self._wire_changelog(self.state_store)
        seen = None
        if self.key_fingerprint is not None:  # before anything is published under it
            seen = await read_announced(s, self.topics.meta)
            try:
                persisted, rotated = await announce_fingerprint(
                    s,
                    self._producer,
                    self.topics.meta,
                    self.key_fingerprint,
                    logged=self._rotation_counted,
                    seen=seen,
                )
            except SecretMismatchError as err:
                self.refused = err
                raise
            self._rotation_counted |= rotated
            # the count the topic keeps: a restart does not set it back to 0
            self.stats.secret_rotations = max(self.stats.secret_rotations, persisted)
        settle_on_start(self, None if seen is None else seen.draws)  # announced just below
        key, value, headers = meta_message({**self.engine.metadata(), **self.meta_extra})
        await self._producer.send_and_wait(self.topics.meta, value=value, key=key, headers=headers)
        self._consumer = make_consumer(s, co_partitioned=self.intake.routing is not None)
        self.intake.consumer = self.delivery.consumer = self._consumer
        self.rebalancing.consumer = self._consumer
        if s.workers is None:
            self._consumer.subscribe(sources, listener=self.rebalancing)
            await self._consumer.start()
        else:
            # static assignment for brokers whose group coordination is unreliable: no joins
            # or rebalances; positions and commits still go through the group id
            await self._consumer.start()
            mine = [
                TopicPartition(topic, p)
                for topic in sources
                for p in s.static_partitions(await self._producer.partitions_for(topic))
            ]
            self._consumer.assign(mine)
            await self.rebalancing.on_partitions_assigned(mine)
        self.started = True
        log.info(
            "worker started: group %s, input %s, output %s, policy %s",
            s.group_id,
            self.topics.input,
            self.topics.output,
            self._version,
        )

    async def _wire_changelog(self, store: PartitionedStore) -> None:
        try:
            routing = await wire_routing(
                self.settings, self.topics, self._producer, create=self.settings.create_topics
            )
        except PartitionCountError as err:
            self.refused = err
            raise
        self.intake.routing = routing
        key_of = self.intake.validator.expected_key or (lambda _rid, _values: None)
        if hasattr(self.engine, "state_partitions"):  # the in-process engine of this backend
            self.engine.state_partitions = StatePartitions(routing.count, key_of)
        topic, producer = self.settings.changelog_topic, self._producer
        loop = asyncio.get_running_loop()
        store.changelog_for = lambda p: KafkaChangelog(producer, loop, topic, [p])

    async def run(self) -> None:
        """Consume until :meth:`request_stop`; then flush, commit and close the clients."""
        try:
            while not self._stopping.is_set():
                self.stats.loop_tick = time.monotonic()
                epoch = self.rebalancing.epoch
                windows = self.lifecycle
                if windows.protecting is not None and windows.protecting.done():
                    async with self._lock:
                        # its outputs go out as soon as it is done; a window already due goes
                        # to the engine first, so the engine does not idle while they are
                        # encoded and produced
                        await windows.protected(then=self._buffer.due(self._clock()))
                unread: list[Any] = []
                try:
                    batch = await self._consumer.getmany(
                        timeout_ms=windows.poll_timeout_ms(),
                        max_records=self.settings.max_poll_records,
                    )
                except UNDECODABLE:  # one record the client cannot decode failed the fetch
                    await self.intake.rewind_to_consumed()
                    batch, unread = await read_around(
                        self._consumer, self.settings.max_poll_records, timeout_ms=200
                    )
                if self.delivery.settling_done():
                    await self.delivery.settled()  # raises if the window's outputs failed
                async with self._lock:
                    if self.rebalancing.halted:
                        break
                    if epoch != self.rebalancing.epoch:
                        # a rebalance happened while this batch was fetched: it may come from
                        # before it, so it is dropped, and the partitions it advanced are put
                        # back to their committed offsets to be read again
                        await self.rebalancing.rewind_to_committed(
                            {**batch, **{tp: [] for tp, _ in unread}}
                        )
                        continue
                    if batch:
                        self.intake.ingest(batch, self._clock())
                    if unread:  # after the records before them (offsets in order)
                        self.intake.undecodable(unread, self._clock())
                    elif windows.protecting is None:  # (a window in the engine is not waited for)
                        await self.intake.check_truncated_logs()
                    reason = self._buffer.due(self._clock(), quiet=not batch)
                    if reason is not None and windows.hands_over(self._buffer_ahead):
                        await windows.protected(then=reason)  # one window at a time in the engine
                    elif reason is None:
                        self._gc.tick(time.monotonic())
                    if not self.ready.is_set() and self._consumer.assignment():
                        self.ready.set()
        except BrokerAway:  # a stop gave up waiting for the broker: nothing more goes out
            pass
        finally:
            await self._shutdown()

    def request_stop(self) -> None:
        self._stopping.set()
        self._deadline.arm(
            self.settings.shutdown_grace_seconds, broker_reachable=self.broker_reachable
        )

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition)s this worker owns now; any thread may ask."""
        consumer = self._consumer
        if consumer is None:
            return []
        return sorted((tp.topic, tp.partition) for tp in list(consumer.assignment()))

    def highwater(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark from the last fetch (None: not fetched yet)."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            return consumer.highwater(TopicPartition(topic, partition))
        except (AssertionError, AttributeError):  # revoked meanwhile (asked from another thread)
            return None

    def decided(self) -> dict[tuple[str, int], int]:
        """Per partition, the next offset after the records decided so far (published,
        dead-lettered or held; :meth:`WindowBuffer.decided`); any thread may ask."""
        return self._buffer.decided()

    async def stop(self) -> None:
        self.request_stop()
        await self._stopped.wait()

    async def _shutdown(self) -> None:
        deadline = self._deadline
        if self._stopping.is_set() and not self.broker_reachable():
            deadline.give_up()
        try:
            if self._consumer is not None:
                async with self._lock:
                    if self.rebalancing.halted:
                        pass  # a state that could not be restored: nothing more goes out
                    elif self.lifecycle.engine_failed:
                        log.error(
                            "the engine failed on a window: nothing more is protected or "
                            "committed; its records and those after them are read again"
                        )
                    elif self.lifecycle.has_pending() and not deadline.given_up:
                        with contextlib.suppress(BrokerAway):
                            await deadline.race(
                                self.lifecycle.flush(
                                    FlushReason.SHUTDOWN,
                                    flush_all=self.settings.flush_held_on_shutdown,
                                )
                            )
                    with contextlib.suppress(BrokerAway):
                        await deadline.race(self.delivery.settled())
                if deadline.given_up:
                    self._stopped_without_broker()
                elif self._buffer.held:
                    log.info(
                        "%d held records left uncommitted for the next owner",
                        len(self._buffer.held),
                    )
                await self._stop_client(self._consumer, deadline.given_up)
            if self._producer is not None:
                await self._stop_client(self._producer, deadline.given_up)
        finally:
            deadline.close()
            self.lifecycle.close()
            for close in self.closers:
                with contextlib.suppress(Exception):
                    close()
            self._gc.stop()
            self._stopped.set()

    def _stopped_without_broker(self) -> None:
        """Say what a stop that gave up waiting for the broker left for the next start."""
        self.delivery.abandon()
        self.left_uncommitted = self._buffer.uncommitted()
        if self.left_uncommitted:
            log.warning(
                "stopped without the broker: %s consumed since the last commit are left "
                "uncommitted and are read again at the next start (state and outputs written "
                "so far are republished identically; nothing is lost)",
                describe_uncommitted(self.left_uncommitted),
            )
        else:
            log.info("stopped while the broker was unreachable; every consumed offset committed")

    @staticmethod
    async def _stop_client(client: Any, gave_up: bool) -> None:
        """A client's stop, which waits for the broker: bounded once the worker gave up.
        aiokafka's consumer lets the CancelledError of its own dead coordinator task escape
        from ``stop``: only a cancellation of this task is passed on."""
        try:
            if gave_up:
                await asyncio.wait_for(client.stop(), CLIENT_STOP_S)
            else:
                await client.stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.debug("%s stopped with its own tasks cancelled", client.__class__.__name__)
        except Exception as err:  # stopping anyway
            log.debug("%s stop failed: %s", client.__class__.__name__, err.__class__.__name__)
        finally:
            left = await cancel_left_tasks(client)
            if left:
                log.debug("%s left %d tasks pending: cancelled", client.__class__.__name__, left)

    def key_fingerprint_checked(self, result: KeyFingerprintResult, where: str) -> None:
        """Log what the state's key fingerprint check found; count an accepted rotation."""
        fp, outcome = self.key_fingerprint, result.outcome
        if outcome is KeyFingerprintCheck.ROTATED and self._rotation_counted:
            log.info("the state in %s now uses key fingerprint %s (rotation counted)", where, fp)
        elif outcome is KeyFingerprintCheck.ROTATED:
            self._rotation_counted = True  # one rotation per run, however many partitions
            self.stats.secret_rotations += 1
            log.warning(
                "privacy event: secret rotated. The state in %s was written with key "
                "fingerprint %s and is now used with %s (rotate_secret): every respondent's "
                "stored values and keyed draws change, so republished values differ from "
                "earlier releases; %d entries keyed by the old secret dropped",
                where,
                ", ".join(result.previous),
                fp,
                result.dropped,
            )
        elif outcome is KeyFingerprintCheck.NEW:
            log.info("key fingerprint %s recorded in the state in %s", fp, where)
        else:
            log.info("key fingerprint %s matches the state in %s", fp, where)

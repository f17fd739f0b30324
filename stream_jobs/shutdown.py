"""Stopping within the grace period, also while the broker is away.

A SIGTERM starts a graceful stop: the window in the engine and what is buffered are protected,
their outputs produced and acknowledged, the offsets committed. With the broker away none of
that can finish: each produce waits for the request timeout (30 s) and the clients' ``stop``
calls wait for it too, so a stop during an outage took 43 s, past the 30 s grace period after
which Docker or Kubernetes kill the process, and ended in "internal error (TimeoutError)".

:class:`StopDeadline` bounds it: once a stop is requested the worker gives up waiting for the
broker when it is known to be unreachable, or at the latest ``give_up_after(grace)`` seconds
later. Giving up loses nothing: state is written before the outputs that depend on it, record
ids are deterministic and offsets are committed only after their outputs are acknowledged, so
whatever was not committed is read again at the next start and republished identically. The
worker then says which offsets it left uncommitted and exits with :data:`EXIT_BROKER_AWAY`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_BROKER_AWAY = 75  # EX_TEMPFAIL: stopped cleanly, but the broker could not confirm it all
CLIENT_STOP_S = 2.0  # a Kafka client's stop after giving up (it waits for the broker else)
_MARGIN_S = 8.0  # of the grace period, for the clients, the engine and the exit
_POLL_S = 0.25  # how often a stopping worker asks whether the broker is still reachable


class BrokerAway(Exception):  # noqa: N818 (a condition the worker handles, not a failure)
    """The worker stopped waiting for the broker during a stop."""


def give_up_after(grace: float) -> float:
    """Seconds after a stop request at which waiting for the broker ends: what the grace
    period leaves after the margin for closing, and at least half of it."""
    return max(grace / 2, grace - _MARGIN_S)


class StopDeadline:
    """When a stopping worker stops waiting for the broker (the event loop's thread only)."""

    def __init__(self) -> None:
        self._given_up = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._poll: asyncio.TimerHandle | None = None

    @property
    def given_up(self) -> bool:
        return self._given_up.is_set()

    def arm(self, grace: float, *, broker_reachable: Callable[[], bool]) -> None:
        """A stop was requested: give up as soon as the broker counts as unreachable, and
        ``give_up_after(grace)`` seconds from now at the latest."""
        if not broker_reachable():
            self._given_up.set()
            return
        if self._timer is not None or self.given_up:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nothing waits
            return
        self._timer = loop.call_later(give_up_after(grace), self._given_up.set)

        def poll() -> None:
            if not broker_reachable():
                self._given_up.set()
            elif not self.given_up:
                self._poll = loop.call_later(_POLL_S, poll)

        self._poll = loop.call_later(_POLL_S, poll)

    def give_up(self) -> None:
        self._given_up.set()

    async def race(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, unless the worker gives up first (:class:`BrokerAway`;
        the awaitable is cancelled)."""
        if self.given_up:
            if asyncio.isfuture(awaitable):
                awaitable.cancel()
            elif asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise BrokerAway
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self._given_up.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise BrokerAway

    def close(self) -> None:
        for handle in (self._timer, self._poll):
            if handle is not None:
                handle.cancel()
        self._timer = self._poll = None


# the parts of an aiokafka client whose coroutines run as tasks of their own
_CLIENT_PARTS = ("client", "_client", "_sender", "_message_accumulator", "_coordinator", "_fetcher")


async def cancel_left_tasks(client: Any) -> int:
    """Cancel, and wait for, the tasks of ``client`` (an aiokafka producer or consumer) still
    pending after its ``stop``: a stop cut short (the broker away) leaves its sender, its
    metadata synchroniser and the ``MessageAccumulator.close`` its ``stop`` started, and
    aiokafka's producer leaves that last one even after a full stop when its sender ends
    first. Left alone they are garbage-collected pending: "ERROR asyncio: Task was destroyed
    but it is pending!" at shutdown. Returns how many were cancelled."""
    parts = {id(client)}
    for name in _CLIENT_PARTS:
        part = getattr(client, name, None)
        if part is not None:
            parts.add(id(part))
            parts.update(id(conn) for conn in getattr(part, "_conns", {}).values())
    current = asyncio.current_task()
    left = [
        task
        for task in asyncio.all_tasks()
        if task is not current and not task.done() and id(_owner(task)) in parts
    ]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=CLIENT_STOP_S)
    return len(left)


def _owner(task: asyncio.Task[Any]) -> object:
    """The object whose method the task runs (its coroutine's ``self``), if any."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    return None if frame is None else frame.f_locals.get("self")


def describe_uncommitted(left: Mapping[tuple[str, int], tuple[int, int]], limit: int = 6) -> str:
    """``topic/partition offsets a-b`` for each partition left uncommitted (the first
    ``limit``), and the total."""
    total = sum(end - start for start, end in left.values())
    parts = [
        f"{topic}/{partition} offsets {start}-{end - 1}"
        for (topic, partition), (start, end) in sorted(left.items())[:limit]
    ]
    more = f" and {len(left) - limit} more partitions" if len(left) > limit else ""
    return f"{total} records ({', '.join(parts)}{more})"

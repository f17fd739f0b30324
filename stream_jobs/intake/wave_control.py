"""An operator closes a panel wave: ``privgw wave close N``.

The command writes one control record to every partition of the input topic: no key, the
header ``privgw-control: wave-close`` and the value ``{"wave": N}``. A worker reads it in order
with the survey's records, so a wave is closed after exactly the records written before the
close, also when a backlog or a restart has the worker read it again: the control record is
consumed like a dead letter, and its offset is committed only with the records before it. Once
every input partition a worker owns has shown the close of wave N (or a later one), the engine's
release clock treats N and every earlier wave as closed: the wave is decided in the next window,
its absentees imputed. Records of the wave read after that are late, as after any close.

Nothing in the record identifies a respondent; a control record that cannot be read (a value
other than a wave number) goes to the dead-letter topic like any malformed record.

A restart forgets the engine's release clock and reads nothing of the waves decided and
committed before it (neither their records nor the closes): a late record of such a wave (a
respondent's first answer to it, after its close) was then held as if its wave were open, until
the next wave closed. So the newest wave the state's panel roster decided counts as closed too
(``DecidedWaves``), read from the state once per scope: the engine publishes such a record at
once, as a late record, as it does without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from gateway.commands.command_kit import add_command, wave_number
from gateway.errors import PrivgwError
from gateway.panel.roster import roster_last_wave
from gateway.policy import MAX_WAVE

HEADER = "privgw-control"
WAVE_CLOSE = b"wave-close"


def control_wave(headers: Sequence[tuple[str, bytes]] | None, value: bytes | None) -> int | None:
    """The wave a control record closes; None: not a control record. Raises ValueError for a
    control record whose value is not ``{"wave": <integer>}``."""
    if not headers:
        return None
    for name, raw in headers:
        if name == HEADER:
            if raw != WAVE_CLOSE:
                raise ValueError("unknown control record")
            break
    else:
        return None
    try:
        body = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        raise ValueError("a wave-close control record's value is not JSON") from None
    # exactly {"wave": N}: a survey record that carries the header (a producer copying
    # headers) would otherwise close its wave and vanish, in neither output nor dead letters
    wave = body.get("wave") if isinstance(body, dict) and len(body) == 1 else None
    if not isinstance(wave, int) or isinstance(wave, bool) or not 0 <= wave <= MAX_WAVE:
        raise ValueError('a wave-close control record\'s value must be {"wave": <integer>}')
    return wave


class WaveCloses:
    """The closes the worker has read, per input partition; ``decided``: the waves its state
    had decided (a restart)."""

    __slots__ = ("decided", "marks")

    def __init__(self) -> None:
        self.marks: dict[tuple[str, int], int] = {}
        self.decided: DecidedWaves | None = None

    def mark(self, topic: str, partition: int, wave: int) -> None:
        at = (topic, partition)
        if wave > self.marks.get(at, -1):
            self.marks[at] = wave

    def closed_through(self, owned: Iterable[tuple[str, int]]) -> int | None:
        """The newest wave closed on every owned partition of a topic that carried a close,
        or decided in the state of every owned scope that decided one (None: none yet)."""
        owned = list(owned)
        best = None if self.decided is None else self.decided.through(owned)
        for topic in {t for t, _ in self.marks}:
            mine = [tp for tp in owned if tp[0] == topic]
            if not mine or any(tp not in self.marks for tp in mine):
                continue  # a partition has not shown the close yet: its records may be due
            through = min(self.marks[tp] for tp in mine)
            best = through if best is None else max(best, through)
        return best


class DecidedWaves:
    """The newest panel wave the state had decided, per state scope (``scoped``: the state
    follows the input partitions, else its one scope is None), read once per scope the worker
    owns: ``read`` gives a scope's roster's last decided wave. Later decisions are the engine's
    own clock's. Scopes that decided no wave yet do not count (nothing of theirs was decided)."""

    __slots__ = ("_known", "_read", "_scoped")

    def __init__(
        self, read: Callable[[int | None], int | None], *, scoped: Callable[[], bool]
    ) -> None:
        self._read, self._scoped = read, scoped
        self._known: dict[int | None, int | None] = {}

    def through(self, owned: Iterable[tuple[str, int]]) -> int | None:
        """The newest wave decided in every scope of ``owned`` (its partitions) that decided
        one; a scope owned again is read again."""
        scopes: list[int | None] = sorted({p for _, p in owned}) if self._scoped() else [None]
        known = self._known
        for gone in set(known).difference(scopes):
            del known[gone]
        waves = []
        for scope in scopes:
            if scope not in known:
                known[scope] = self._read(scope)
            wave = known[scope]
            if wave is not None:
                waves.append(wave)
        return min(waves) if waves else None


def decided_wave(store: Any, scope: int | None) -> int | None:
    """The newest wave the panel roster of ``scope`` in ``store`` decided (None: none): a
    store of another process, or several, says it (``panel_last_wave``); nothing sealed is
    opened."""
    if store is None:
        return None
    last = getattr(store, "panel_last_wave", None)
    if last is not None:
        return last()  # type: ignore[no-any-return]
    return roster_last_wave(store.get_many, scope)


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "wave",
        "panel waves: close one now (the workers decide it in their next window)",
        "privgw wave close 3 --policy deploy/policies/adult.yaml --bootstrap 127.0.0.1:9092",
    )
    actions = p.add_subparsers(dest="wave_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "close",
        "close wave N and every earlier one: a control record on every input partition, "
        "after the records already written",
        "privgw wave close 3 --policy deploy/policies/adult.yaml --bootstrap 127.0.0.1:9092",
    )
    p.add_argument("wave", type=wave_number, help="the wave number to close")
    p.add_argument("--policy", required=True, help="policy YAML (its input topic)")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (env PRIVGW_BOOTSTRAP)")
    p.add_argument("--input-topic", help="overrides the policy's input.topic")
    p.set_defaults(func=cmd_wave_close)


def cmd_wave_close(args: argparse.Namespace) -> int:
    from gateway.policy import RepublicationMode, load_policy  # noqa: PLC0415
    from stream_jobs.worker_build import worker_settings  # noqa: PLC0415

    policy = load_policy(args.policy)
    rep = policy.republication
    if rep.wave_attribute is None or rep.mode is not RepublicationMode.PANEL:
        raise PrivgwError(
            f"{args.policy} publishes no panel waves: wave close needs republication.mode: "
            "panel and a wave_attribute"
        )
    settings = worker_settings(bootstrap=args.bootstrap, input_topic=args.input_topic)
    topic = settings.topics(policy).input
    count = asyncio.run(_send(settings, topic, args.wave))
    print(f"wave {args.wave} closed on {count} partitions of {topic}")
    return 0


async def _send(settings: Any, topic: str, wave: int) -> int:
    from stream_jobs.kafka import check_bootstrap, make_producer, topic_partitions  # noqa: PLC0415

    await check_bootstrap(settings)
    count = await topic_partitions(settings, topic)
    if count is None:
        raise PrivgwError(f"input topic {topic} does not exist: check --input-topic / the policy")
    producer = make_producer(settings)
    await producer.start()
    try:
        value = orjson.dumps({"wave": wave})
        sent = [
            await producer.send(topic, value, partition=p, headers=[(HEADER, WAVE_CLOSE)])
            for p in range(count)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return count

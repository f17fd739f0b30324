"""The deployment secret's fingerprint on the metadata topic, and every rotation.

The state stores the fingerprint of the secret it was written with, but a lost state directory
loses it too: a new secret on a fresh state changed 63.6 % of randomized values without a word.
The metadata topic outlives any worker's disk, so each worker announces there the fingerprint
it runs with (once per new fingerprint), and at start compares its own with the newest one
announced: another one is refused unless ``--rotate-secret``, which announces the rotation.
Announcements have keys of their own, one per event (``privgw/key-fingerprint/<fp>/<ms>``), so a
compacted topic keeps every rotation; their count is the persisted rotation count
(``privgw_secret_rotations_total`` starts from it, so a restart does not hide a rotation).
Analysts' readers skip them (:func:`is_announcement`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.keyed.draw_derivation import DrawDerivation, agree, state_binds
from gateway.state_store.state_api import SecretMismatchError
from stream_jobs.delivery.meta import ANNOUNCEMENT_PREFIX, is_announcement
from stream_jobs.delivery.topic_reader import read_topic
from stream_jobs.kafka import existing_topics
from stream_jobs.secret.draw_settle import announced_draws
from stream_jobs.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Announced:
    newest: str | None  # the newest fingerprint announced (None: none yet)
    rotations: int  # rotation announcements ever
    # the draw derivation announced (stream_jobs.secret.draw_settle)
    draws: DrawDerivation | None = None


def announcement(
    fingerprint: str, previous: str | None, *, rotation: bool = False
) -> tuple[bytes, bytes]:
    """``rotation``: also a rotation that a new topic's previous announcement does not show
    (the state's check accepted it)."""
    now_ms = int(time.time() * 1000)
    value = {
        "kind": "key_fingerprint",
        "key_fingerprint": fingerprint,
        "previous_key_fingerprint": previous,
        "rotation": rotation or previous is not None,
        "announced_at_ms": now_ms,
    }
    return ANNOUNCEMENT_PREFIX + f"{fingerprint}/{now_ms}".encode(), orjson.dumps(value)


async def read_announced(settings: WorkerSettings, meta_topic: str) -> Announced:
    records = await read_topic(
        settings.bootstrap, meta_topic, timeout=10.0, quiet=0.3, settings=settings
    )
    newest: tuple[tuple[int, int], str] | None = None
    rotations = 0
    for m in records:
        if not is_announcement(m.key) or m.value is None:
            continue
        try:
            doc = orjson.loads(m.value)
            fingerprint = str(doc["key_fingerprint"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("%s/%d/%d: unreadable key announcement skipped", meta_topic, 0, m.offset)
            continue
        rotations += bool(doc.get("rotation"))
        order = (int(doc.get("announced_at_ms", m.timestamp)), m.offset)
        if newest is None or order > newest[0]:
            newest = (order, fingerprint)
    return Announced(newest[1] if newest else None, rotations, announced_draws(records, meta_topic))


def check_announced_fingerprint(
    settings: WorkerSettings, meta_topic: str, seen: Announced, fingerprint: str
) -> None:
    """Refuse a secret other than the one the topic announces last (unless rotate_secret)."""
    if seen.newest not in (None, fingerprint) and not settings.rotate_secret:
        raise SecretMismatchError(
            f"the metadata topic {meta_topic} announces key fingerprint {seen.newest}, but the "
            f"secret in force (PRIVGW_SECRET / PRIVGW_SECRET_FILE) has {fingerprint}: a changed "
            "secret changes every keyed draw, even with a fresh state directory. Use the "
            "secret announced there, or accept the new one with --rotate-secret (env "
            "PRIVGW_ROTATE_SECRET=1)"
        )


async def check_before_writing(
    settings: WorkerSettings,
    meta_topic: str,
    fingerprint: str,
    state_draws: list[tuple[str | None, bool]] | None,
) -> None:
    """What the metadata topic announces against the secret and the state, before anything is
    written to the state directory (issue 45, item 5: a refused start used to leave the wrong
    fingerprint in a new directory, which then refused the right secret). ``state_draws``: per
    state file, (its recorded draw derivation, whether it has entries); None: draws not keyed.
    The worker checks both again, and announces, when it starts."""
    if meta_topic not in await existing_topics(settings):
        return  # a new deployment: nothing announced yet
    seen = await read_announced(settings, meta_topic)
    check_announced_fingerprint(settings, meta_topic, seen, fingerprint)
    if state_draws is not None:
        where = f"{settings.state_dir} and {meta_topic}"
        bound = {b for rec, has in state_draws if (b := state_binds(rec, has, where))}
        agree(bound, seen.draws, where=where)


async def announce_fingerprint(
    settings: WorkerSettings,
    producer: Any,
    meta_topic: str,
    fingerprint: str,
    *,
    logged: bool = False,
    seen: Announced | None = None,
) -> tuple[int, bool]:
    """Check ``fingerprint`` against the newest announced one; announce it if new (a rotation
    with ``settings.rotate_secret``, else refused). Returns the rotations announced ever and
    whether this call announced one.
    ``logged``: the state check already logged this rotation's privacy event. ``seen``: the
    topic as the caller read it (else read here)."""
    if seen is None:
        seen = await read_announced(settings, meta_topic)
    if seen.newest == fingerprint:
        return seen.rotations, False
    check_announced_fingerprint(settings, meta_topic, seen, fingerprint)
    # a rotation the state's check accepted is announced as one on a new topic too: else the
    # topic's count, which a restart starts from, lost it
    key, value = announcement(fingerprint, seen.newest, rotation=logged)
    await producer.send_and_wait(meta_topic, value=value, key=key)
    if seen.newest is None and not logged:
        log.info("key fingerprint %s announced on %s", fingerprint, meta_topic)
        return seen.rotations, False
    if logged:
        log.info("rotation to key fingerprint %s announced on %s", fingerprint, meta_topic)
    else:  # e.g. a fresh state directory: only the topic knew the secret before
        log.warning(
            "privacy event: secret rotated. Key fingerprint %s replaces %s (announced on "
            "%s): every keyed draw changes, so republished values differ from earlier "
            "releases",
            fingerprint,
            seen.newest,
            meta_topic,
        )
    return seen.rotations + 1, True

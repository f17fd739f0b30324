"""The deployment's draw derivation at the worker's start (``gateway.keyed.draw_derivation``).

The state records the derivation its entries were drawn with, but a lost state directory
loses it; the metadata topic outlives any worker's disk. Its policy records carry the
derivation (``draw_derivation``); one written before derivations were recorded, by a
sticky (keyed) deployment, means HMAC. At start the worker settles its engine on one
derivation: the state's (refused if the topic announces another), else the topic's (a lost
state replays byte-identical), else the default for new deployments. The metadata record it
publishes next announces it. Partitions of the partitioned backend are checked as they are
restored (:func:`check_partitions`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.keyed.draw_derivation import (
    LEGACY_DERIVATION,
    META_NAME,
    DrawDerivation,
    DrawDerivationError,
    check_parts,
    parse,
    settle,
)
from stream_jobs.delivery.meta import is_announcement

log = logging.getLogger(__name__)


def announced_draws(records: Sequence[Any], topic: str) -> DrawDerivation | None:
    """The derivation the newest keyed policy record of the metadata topic announces (None:
    no such record, a new deployment)."""
    found: DrawDerivation | None = None
    for m in records:
        if is_announcement(m.key) or m.value is None:
            continue
        try:
            doc = orjson.loads(m.value)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict) or "policy_version" not in doc:
            continue
        if META_NAME in doc:
            found = parse(str(doc[META_NAME]), f"the metadata topic {topic}")
        elif doc.get("consistency") == "sticky":  # keyed draws before they were recorded
            found = LEGACY_DERIVATION
    return found


def settle_on_start(worker: Any, announced: DrawDerivation | None) -> DrawDerivation | None:
    """Settle ``worker.engine`` on the deployment's derivation before anything is published
    (refused, with ``worker.refused`` set, when the state and the topic disagree)."""
    if getattr(worker.engine, "draws", None) is None:
        # not keyed, or an engine that does not say how it draws (a wrapper around one):
        # it keeps what it was built with
        return None
    where = f"{worker.settings.state_dir} and {worker.topics.meta}"
    bound = worker.engine.draws_bound()
    try:
        chosen = settle([worker.engine], announced, where=where)
    except DrawDerivationError as err:
        worker.refused = err
        raise
    if chosen is not None:
        why = (
            "drawn with by the state"
            if bound is not None
            else "announced on the metadata topic"
            if announced is not None
            else "a new deployment"
        )
        log.info("keyed draws: the %s derivation (%s)", chosen.value, why)
    return chosen


async def check_partitions(worker: Any, stores: Sequence[Any], wanted: list[int]) -> None:
    """Restored partitions against the engine's derivation (off the loop: a derivation
    recorded goes through the changelog, which sends on the loop). Another one: stop before
    any of their records is processed."""
    derivation = getattr(worker.engine, "draws", None)  # None: as in settle_on_start
    if derivation is None or worker.refused is not None:
        return
    where = f"partitions {wanted} of {worker.settings.state_dir}"
    check = functools.partial(check_parts, stores, derivation, where=where)
    try:
        recorded = await asyncio.get_running_loop().run_in_executor(None, check)
    except DrawDerivationError as err:
        log.error("%s", err)
        worker.refused = err
        worker.request_stop()
        return
    if recorded:
        log.info("draw derivation %s recorded in %s", derivation.value, where)

"""What each record of a panel window publishes, gathered while its waves are decided: its
class's tuple and weight, its id, suppressed or not; the imputed members to build and the stored
imputed records to send again; the measures and class sizes that go into the window's report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.columns import Output
from gateway.engine.records import SourceRef, ValidRecord, WindowReport, window_digest
from gateway.panel.imputed import Imputed, PanelWindow
from gateway.panel.output import unfollowed_record_id


@dataclass(slots=True)
class WindowPlan:
    """What each of the window's records (and each imputed member) publishes."""

    tuples: dict[int, Sequence[Any]] = field(default_factory=dict)
    weights: dict[int, float | None] = field(default_factory=dict)
    ids: dict[int, str] = field(default_factory=dict)
    suppressed: list[int] = field(default_factory=list)
    # decided, not published: a late record of an imputed member (its imputed record stands for
    # it), or a member's repeat within a wave (its first record stands for it)
    dropped: set[int] = field(default_factory=set)
    # imputed members to build: (scope, wave, roster row, class tuple, weight, record id)
    imputed: list[Imputed] = field(default_factory=list)  # absent members to publish
    replayed: list[tuple[list[str], list[list[Any]], list[str]]] = field(default_factory=list)
    measures: dict[str, float] = field(default_factory=dict)
    classes: list[int] = field(default_factory=list)  # published class sizes, for the report
    # a record republished from a stored outcome (a record read again): its class's size in
    # its release, which the window holds only part of
    release_sizes: dict[int, int] = field(default_factory=dict)


def batches(
    pw: PanelWindow, waves: list[int | None], plan: WindowPlan
) -> list[tuple[tuple[int | None, int], list[int]]]:
    """The window's records by (scope, wave), oldest wave first; a record without a wave is
    published with its quasi-identifiers suppressed."""
    out: dict[tuple[int | None, int], list[int]] = {}
    for i, wave in enumerate(waves):
        if wave is None:
            plan.suppressed.append(i)
            plan.ids[i] = unfollowed_record_id(pw.rids[i])
            continue
        scope = pw.scopes[i] if pw.scopes is not None else None
        out.setdefault((scope, wave), []).append(i)
    return sorted(out.items(), key=lambda kv: (kv[0][1], -1 if kv[0][0] is None else kv[0][0]))


def window_report(
    pw: PanelWindow, plan: WindowPlan, out: Output, *, published: int, suppressed: int
) -> WindowReport:
    n_in = len(pw.records)  # every record of the window is decided (or stands for a re-sent one)
    return WindowReport(
        window_id=window_digest(pw.rids),
        records_in=n_in,
        published=n_in - len(plan.dropped),
        held=0,
        suppressed=suppressed,
        min_group_size=min(plan.classes) if plan.classes else None,
        groups=len(plan.classes),
        sticky_hits=out.hits,
        risk_sampled=bool(plan.measures),
        measures=dict(plan.measures),
        retention=out.retention,
        randomized=out.randomized,
        noise_sd=out.noise_sd,
        imputed=published - (n_in - len(plan.dropped)),
        withheld=len(plan.dropped),
    )


def input_through(records: Sequence[ValidRecord], idx: list[int]) -> dict[str, int] | None:
    """The newest input offset of the records at ``idx`` by input partition; None when one has
    no input position (then every record of the wave read again counts as read before)."""
    sources = [s for i in idx if (s := records[i].source) is not None]
    if len(sources) < len(idx):
        return None
    newest: dict[tuple[str, int], int] = {}
    for topic, partition, offset, _ in sources:
        if offset > newest.get((topic, partition), -1):
            newest[topic, partition] = offset
    return {_partition_name(*tp): offset for tp, offset in newest.items()}


def read_before(source: SourceRef | None, through: dict[str, int] | None) -> bool:
    """Whether a record of a decided wave was read when the wave was decided (a restart reads it
    again), not a late copy appended to the input since."""
    if source is None or through is None:
        return True
    return source.offset <= through.get(_partition_name(source.topic, source.partition), -1)


def _partition_name(topic: str, partition: int) -> str:
    """An input partition as an outcome's offsets name it (a msgpack map key: text)."""
    return f"{topic}/{partition}"

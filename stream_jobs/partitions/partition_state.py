"""Which input partitions a worker's own state (the sqlite backend) holds, and a guard against
partitions that arrive without it.

With the sqlite backend a respondent's state is in the state directory of the worker that
protected its records. Kafka keeps a respondent on one partition, so the state of a partition
is where that partition was processed. When a partition moves to another worker — a member of
the group killed or added, a changed ``--workers`` count, a state directory lost — the new
owner regroups its respondents from nothing (randomized response stays identical through keyed
draws; microaggregated tuples change) and says only "assigned 4 partitions". The partitioned
backend moves state with the partition (its changelog); this module guards the sqlite one.

A small ledger next to the state (``partitions.json``) records, per (topic, partition), the
offset up to which this state has processed records; it is written (atomically) before every
offset commit, so it is never behind the commits of this worker. When a partition is
assigned, the group's committed offset is compared with it: a commit beyond the ledger's
offset — or any commit for a partition the ledger does not know — means records of it were
protected by another worker, whose state this directory lacks. The worker then stops before
processing any of them (exit 2, one line naming the partitions), unless the operator accepts
the loss with ``--allow-missing-partition-state``: then a WARNING names the partitions on
every assignment that brings such partitions.

A state directory written before the ledger existed adopts what it is assigned at its first
start (logged), and a new state directory with no committed offsets in the group starts clean.

Who committed beyond the ledger (issue 45, item 7): the ledger carries a random ``state_id``,
created once with it (a backup or a copy keeps it), and every commit carries it as its
metadata. A commit with this directory's own id means the directory was restored from a backup
older than the commits; another id, another worker's state. The refusal says which, and the
fix for it: after a restore, ``privgw offsets reset`` (:mod:`stream_jobs.commands.offsets_cli`)
takes the group back to the ledger's offsets and records the range to protect again
(``republish``); those records' outputs carry the header ``supersedes: true`` (their groups may
be formed differently: a consumer keeps the last copy of each record id).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.errors import PrivgwError
from state.failures import os_error

log = logging.getLogger(__name__)

LEDGER = "partitions.json"
TP = tuple[str, int]
COMMIT_TAG = "privgw-state/"  # + the ledger's state_id: the metadata of every commit
SUPERSEDES = ("supersedes", b"true")  # the header of an output protected again after a restore


class MissingPartitionStateError(PrivgwError):
    """Partitions assigned to this worker were processed by another worker: their state is
    not in this state directory."""


class PartitionLedger:
    """``partitions.json``: per (topic, partition), the next offset this state has processed
    up to. Written whole to a temporary file and renamed over the old one (a crash leaves the
    old or the new ledger, never half of one)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LEDGER
        self.offsets: dict[TP, int] = {}
        # offsets below which a partition's records are protected again after a restore
        self.republish: dict[TP, int] = {}
        self.state_id = secrets.token_hex(8)  # a ledger written before ids: one from now on
        self.existed = self.path.is_file()
        if self.existed:
            try:
                doc = json.loads(self.path.read_text(encoding="utf-8"))
                self.offsets = _offsets(doc["processed"])
                self.republish = _offsets(doc.get("republish", {}))
                self.state_id = str(doc.get("state_id") or self.state_id)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                raise MissingPartitionStateError(
                    f"partition ledger {self.path} cannot be read ({err.__class__.__name__}): "
                    "restore it with the state directory's backup, or remove it to adopt the "
                    "partitions assigned at the next start"
                ) from None

    def record(self, offsets: Mapping[TP, int]) -> None:
        """Raise the recorded offsets to ``offsets`` (never lower them); written if changed.
        A range protected again is forgotten once the offsets pass its end."""
        changed = False
        for tp, offset in offsets.items():
            if offset > self.offsets.get(tp, -1):
                self.offsets[tp] = offset
                changed = True
            if tp in self.republish and offset >= self.republish[tp]:
                del self.republish[tp]
                changed = True
        if changed:
            self._write()

    def superseding(self, tp: TP, offset: int) -> bool:
        """Whether the record at ``offset`` of ``tp`` is protected again after a restore."""
        return offset < self.republish.get(tp, -1)

    def write(self) -> None:
        self._write()

    def _write(self) -> None:
        doc = {
            "version": 1,
            "state_id": self.state_id,
            "processed": _by_topic(self.offsets),
            "republish": _by_topic(self.republish),
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(doc), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as err:  # a full or read-only disk: named, like the store's errors
            raise os_error(err, self.path, "partition ledger") from None
        self.existed = True


def _offsets(doc: Mapping[str, Mapping[str, Any]]) -> dict[TP, int]:
    return {(t, int(p)): int(offset) for t, parts in doc.items() for p, offset in parts.items()}


def _by_topic(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, p), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return out


def missing(recorded: int | None, committed: int | None) -> bool:
    """Whether records of a partition were processed elsewhere: the group committed beyond
    what this state processed (or committed anything for a partition it never had)."""
    if committed is None or committed <= 0:
        return False
    return recorded is None or committed > recorded


class PartitionStateGuard:
    """Checks each assignment against the ledger (see the module docstring)."""

    def __init__(self, state_dir: Path, *, allow_missing: bool, has_state: bool) -> None:
        self.ledger = PartitionLedger(state_dir)
        self.allow_missing = allow_missing
        # a state written before the ledger existed: adopt the first assignment
        self._adopt = not self.ledger.existed and has_state

    async def check(self, consumer: Any, assigned: Sequence[Any]) -> PrivgwError | None:
        """The error that must stop the worker, or None (the ledger then covers every
        assigned partition at the group's committed offset)."""
        committed: dict[TP, int | None] = {}
        for tp in assigned:
            offset = await consumer.committed(tp)
            committed[(tp.topic, tp.partition)] = None if offset is None else int(offset)
        gone = {
            tp: (self.ledger.offsets.get(tp), offset)
            for tp, offset in sorted(committed.items())
            if missing(self.ledger.offsets.get(tp), offset)
        }
        if gone and self._adopt:
            log.info(
                "state written before partitions were tracked: recorded %s as this state's",
                _names(gone),
            )
        elif gone and not self.allow_missing:
            who = _committer(await _commit_tags(consumer, assigned, gone), self.ledger.state_id)
            return MissingPartitionStateError(self._refusal(gone, who))
        elif gone:
            log.warning(
                "partitions %s arrive without their state (offsets %s were protected under "
                "state this directory does not hold): their respondents are regrouped here "
                "(--allow-missing-partition-state)",
                _names(gone),
                _spans(gone),
            )
        self._adopt = False
        self.ledger.record({tp: offset or 0 for tp, offset in committed.items()})
        return None

    def _refusal(self, gone: Mapping[TP, tuple[int | None, int | None]], who: str) -> str:
        """What happened and the fix, by who committed beyond the ledger (``_committer``)."""
        where = self.ledger.path.parent
        head = (
            f"partitions {_names(gone)} were assigned to this worker, but the group committed "
            f"them beyond what the state in {where} has processed (offsets {_spans(gone)}). "
        )
        accept = (
            "to accept the gap once, --allow-missing-partition-state "
            "(PRIVGW_ALLOW_MISSING_PARTITION_STATE): their respondents are regrouped"
        )
        restored = (
            f"take the group back to the state's offsets with `privgw offsets reset "
            f"--state-dir {where}` (same --group-id and --bootstrap as the worker, every "
            "worker of the group stopped): those records are protected again, marked "
            "superseding"
        )
        elsewhere = (
            "give the partitions back to the worker whose state directory has them (the sqlite "
            "backend keeps state per worker: static assignment, --workers/--worker-index, each "
            "with its own state directory), or run --state-backend partitioned (state follows "
            "partitions)"
        )
        if who == "self":
            return (
                f"{head}Those commits were made with this very state, so {where} was restored "
                f"from a backup (or a copy) older than them. To republish the gap, {restored}; "
                f"{accept}"
            )
        if who == "other":
            return (
                f"{head}Those commits were made by another worker, with another state directory, "
                f"so their state is not here: {elsewhere}; {accept}"
            )
        return (
            f"{head}Either {where} was restored from an older backup (then {restored}), or "
            f"another worker protected them (then {elsewhere}); {accept}"
        )

    @property
    def commit_metadata(self) -> str:
        """The metadata of this state's commits: who committed (see the module docstring)."""
        return COMMIT_TAG + self.ledger.state_id

    def superseding(self, tp: TP, offset: int) -> bool:
        return self.ledger.superseding(tp, offset)

    def republishing(self) -> bool:
        """Whether records of a restored range are still to be protected again: an output
        that names no input record (a panel's, keyed per respondent and wave) produced now
        may be one of them."""
        return bool(self.ledger.republish)

    def before_commit(self, commits: Mapping[TP, int]) -> None:
        """Record the offsets about to be committed (before the commit, so the ledger is
        never behind this worker's own commits, even after a crash)."""
        self.ledger.record(commits)


def _names(gone: Mapping[TP, Any]) -> str:
    return ", ".join(f"{topic}/{p}" for topic, p in gone)


def _spans(gone: Mapping[TP, tuple[int | None, int | None]]) -> str:
    return ", ".join(
        f"{topic}/{p} {recorded or 0}-{(committed or 1) - 1}"
        for (topic, p), (recorded, committed) in gone.items()
    )


async def _commit_tags(
    consumer: Any, assigned: Sequence[Any], gone: Mapping[TP, Any]
) -> dict[TP, str]:
    """The metadata of the group's commits of ``gone`` (aiokafka's ``committed`` returns the
    offset only; its coordinator fetches both). {} when it cannot be read."""
    fetch = getattr(getattr(consumer, "_coordinator", None), "fetch_committed_offsets", None)
    if fetch is None:
        return {}
    tps = [tp for tp in assigned if (tp.topic, tp.partition) in gone]
    try:
        found = await fetch(tps)
    except Exception as err:
        log.debug("commit metadata not read: %s", err.__class__.__name__)
        return {}
    return {(tp.topic, tp.partition): str(om.metadata or "") for tp, om in found.items()}


def _committer(tags: Mapping[TP, str], state_id: str) -> str:
    """ "self": every commit carries this state's id; "other": one carries another privgw
    state's id; "unknown" otherwise (commits made before ids were recorded)."""
    ours = COMMIT_TAG + state_id
    if tags and all(t == ours for t in tags.values()):
        return "self"
    if any(t.startswith(COMMIT_TAG) and t != ours for t in tags.values()):
        return "other"
    return "unknown"

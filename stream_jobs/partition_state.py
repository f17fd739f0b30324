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
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.errors import PrivgwError
from state.failures import os_error

log = logging.getLogger(__name__)

LEDGER = "partitions.json"
TP = tuple[str, int]


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
        self.existed = self.path.is_file()
        if self.existed:
            try:
                doc = json.loads(self.path.read_text(encoding="utf-8"))
                self.offsets = {
                    (topic, int(p)): int(offset)
                    for topic, parts in doc["processed"].items()
                    for p, offset in parts.items()
                }
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                raise MissingPartitionStateError(
                    f"partition ledger {self.path} cannot be read ({err.__class__.__name__}): "
                    "restore it with the state directory's backup, or remove it to adopt the "
                    "partitions assigned at the next start"
                ) from None

    def record(self, offsets: Mapping[TP, int]) -> None:
        """Raise the recorded offsets to ``offsets`` (never lower them); written if changed."""
        changed = False
        for tp, offset in offsets.items():
            if offset > self.offsets.get(tp, -1):
                self.offsets[tp] = offset
                changed = True
        if changed:
            self._write()

    def _write(self) -> None:
        processed: dict[str, dict[str, int]] = {}
        for (topic, p), offset in sorted(self.offsets.items()):
            processed.setdefault(topic, {})[str(p)] = offset
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"version": 1, "processed": processed}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as err:  # a full or read-only disk: named, like the store's errors
            raise os_error(err, self.path, "partition ledger") from None
        self.existed = True


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
            return MissingPartitionStateError(
                f"partitions {_names(gone)} were assigned to this worker, but records of them "
                f"were protected by another worker (offsets {_spans(gone)}): their state is "
                f"not in {self.ledger.path.parent}, and their respondents would be regrouped. "
                "The sqlite backend keeps state per worker: run one worker per partition set "
                "(static assignment, --workers/--worker-index) with its own state directory, "
                "or --state-backend partitioned (state follows partitions); to accept the loss "
                "once, --allow-missing-partition-state (PRIVGW_ALLOW_MISSING_PARTITION_STATE)"
            )
        elif gone:
            log.warning(
                "partitions %s arrive without their state (records of them were protected by "
                "another worker, offsets %s): their respondents are regrouped here "
                "(--allow-missing-partition-state)",
                _names(gone),
                _spans(gone),
            )
        self._adopt = False
        self.ledger.record({tp: offset or 0 for tp, offset in committed.items()})
        return None

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

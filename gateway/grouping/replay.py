"""What a respondent's records published, for as long as they may be read again.

The stream commits a window's offsets only once its outputs are acknowledged, never past a
held record, and hands the next window to the engine (which writes its state) before the
outputs of the one before are out. After a crash, records are therefore read again whose
decisions are already in the state, together with the decisions of later windows: a group may
have entered a later release since, recomputed its tuple or lost members. Deciding such a
record again would publish it differently (a duplicate that differs) or, when its first copy
was never delivered, split its class in its release below k.

The ``regroup`` and ``cohort`` modes therefore keep, in each respondent's state under ``p``, what
its records published until their offsets are committed: the record id (its source coordinates,
not personal) and a prefix of its keyed claim digest, with the group and the release that set
the group's tuple then (the group keeps the tuples it replaced:
:meth:`gateway.grouping.registry.Group.tuple_at`), or no group for a record published with its
quasi-identifiers suppressed. A record found there publishes that again and changes nothing
else. Entries go when a later write finds their offset committed (``committed``, from the
worker); at most :data:`KEPT` stay, so the file workflow and callers that know no offsets keep
a bounded state.

Record ids rather than (release, values): a release of the window-pool mode is its window's id,
which a replay forms anew. The digest prefix keeps a record id reused by a recreated topic from
matching another answer of the same respondent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gateway.grouping.window_work import Outcome, WindowWork

KEPT = 8  # entries per respondent at most, newest last
_DIGEST_CHARS = 8

# (topic, partition) -> the committed offset: every record below it is done
Committed = Mapping[tuple[str, int], int]


def recall(state: Mapping[str, Any], record_id: str, digest: str) -> Outcome | Literal[False]:
    """What the record published, or False when the state does not know it."""
    for entry in state.get("p", ()):
        if entry[0] == record_id and entry[1] == digest[:_DIGEST_CHARS]:
            return None if len(entry) == 2 else (str(entry[2]), str(entry[3]))
    return False


def remember(
    state: dict[str, Any], record_id: str, digest: str, outcome: Outcome, committed: Committed
) -> None:
    """Keep what the record published; drop the entries whose records are committed."""
    entry: list[Any] = [record_id, digest[:_DIGEST_CHARS]]
    if outcome is not None:
        entry.extend(outcome)
    kept = [e for e in state.get("p", ()) if e[0] != record_id and not _done(e[0], committed)]
    kept.append(entry)
    state["p"] = kept[-KEPT:]


def _done(record_id: str, committed: Committed) -> bool:
    """Whether the record's offset is committed (it cannot be read again)."""
    if not committed:
        return False
    topic, _, rest = record_id.rpartition("/")
    topic, _, partition = topic.rpartition("/")
    try:
        return int(rest) < committed.get((topic, int(partition)), -1)
    except ValueError:  # not a stream record's id
        return False


# -- a window's replays (gateway.grouping.republish) --------------------------------------
def recall_unknown(win: WindowWork) -> bool:
    """Replayed records whose group no longer knows the tuple they published are decided
    again, as if new here; whether there were any."""
    keys, states, again = win.w.keys, win.states, False
    for i, outcome in list(win.replayed.items()):
        if outcome is None:
            continue
        grp = win.groups.get(outcome[0])
        if grp is None or grp.tuple_at(outcome[1]) is None:
            del win.replayed[i]
            key = keys[i]
            assert key is not None
            win.enter(i, states.get(key))
            again = True
    return again


def publish_replays(win: WindowWork) -> None:
    """Records decided before a crash publish what they published then."""
    d, digests, groups = win.decision, win.w.digests, win.groups
    for i, outcome in win.replayed.items():
        if outcome is None:
            d.suppressed.append(i)
            continue
        gid, tuple_release = outcome
        tuple_ = groups[gid].tuple_at(tuple_release)
        assert tuple_ is not None  # checked by _recall
        d.tuples[i], d.group_of[i], d.digests[i] = tuple_, gid, digests[i]
        win.emitted[i] = tuple_release
        d.hits += 1


def window_outcomes(win: WindowWork) -> None:
    """What each record published here (not replayed), into the decision's ``outcomes``."""
    w, d = win.w, win.decision
    replayed, keys, digests, emitted = win.replayed, w.keys, w.digests, win.emitted
    outcomes = d.outcomes
    for i, gid in d.group_of.items():
        if keys[i] is not None and i not in replayed and i in d.tuples:
            outcomes[i] = (digests[i], (gid, emitted[i]))
    complete = w.complete
    for i in d.suppressed:
        if keys[i] is not None and complete[i] and i not in replayed:
            outcomes[i] = (digests[i], None)

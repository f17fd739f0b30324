"""The panel roster's bytes: carried values only as AES-GCM ciphertext, a round trip that keeps
everything, and a clear error under another secret."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.panel.roster import Outcome, Roster, Sealer, roster_key
from gateway.state_store.state_codec import registry_counts

CANARY = "Canary-Value-7f3a"


def _roster() -> Roster:
    r = Roster()
    for i in range(7):
        r.add(
            bytes([i]) * 32, i // 5, 1, [[40.0 + i, CANARY], {"occ": CANARY, "pay": 1234.5}, 2.0, 1]
        )
    r.linked = [set(range(5)) for _ in range(5)] + [{5, 6}, {5, 6}]
    r.active[6] = False
    r.streak[3] = 2
    r.next_cohort = 2
    for wave in range(1, 7):  # the newest four are kept
        r.decided(
            Outcome(wave, np.array([0, 0, 0, 0, 0, 1, -1], dtype=np.int32), [[40.0, "x"]], [1.5])
        )
    return r


def test_round_trip_keeps_every_column() -> None:
    sealer, key = Sealer(b"k" * 32), roster_key(None)
    r = _roster()
    back = Roster.decode(r.encode(sealer, key), sealer, key)
    for name in ("keys", "cohort", "active", "streak", "seen", "linked", "carried", "next_cohort"):
        assert getattr(back, name) == getattr(r, name), name
    assert [o.wave for o in back.outcomes] == [3, 4, 5, 6] and back.last_wave == 6
    kept = back.outcome_of(5)
    assert kept is not None and kept.class_of.tolist() == [0, 0, 0, 0, 0, 1, -1]
    assert back.row_of(bytes([3]) * 32) == 3


def test_no_true_value_in_the_clear() -> None:
    raw = _roster().encode(Sealer(b"k" * 32), roster_key(None))
    assert CANARY.encode() not in raw
    assert b"1234.5" not in raw
    # the registry's counters read it as one group: its active members and its rows
    assert registry_counts(raw) == (6, 7)


def test_another_secret_is_named() -> None:
    raw = _roster().encode(Sealer(b"k" * 32), roster_key(3))
    with pytest.raises(ValueError, match="another one"):
        Roster.decode(raw, Sealer(b"j" * 32), roster_key(3))
    with pytest.raises(ValueError, match="another one"):  # bound to its entry's key too
        Roster.decode(raw, Sealer(b"k" * 32), roster_key(4))


def test_a_migration_and_a_live_count_audit_leave_the_roster_alone() -> None:
    """The roster is shaped as a registry entry (so partitioned state routes it) but is no
    group: a migration that re-forms every group, or a live-count repair, never rewrites it."""
    from gateway.policy.migration import MigrationPlan, groups_to_drop  # noqa: PLC0415
    from gateway.state_store.live_counts import audit_live_counts  # noqa: PLC0415

    key = roster_key(2)
    raw = _roster().encode(Sealer(b"k" * 32), key)
    dropped, rows, seen = groups_to_drop([(key, raw)], MigrationPlan(regroup_all=True))
    assert (dropped, rows, seen) == (set(), {}, 0)
    assert not audit_live_counts([(key, raw)]).drifted


def test_an_empty_roster_round_trips() -> None:
    sealer, key = Sealer(b"k" * 32), roster_key(None)
    back = Roster.decode(Roster().encode(sealer, key), sealer, key)
    assert back.keys == [] and back.linked == [] and back.carried == [] and back.last_wave is None

"""The panel roster's bytes: carried values only as AES-GCM ciphertext, a round trip that keeps
everything, a clear error under another secret, and a roster written in parts that a write cut
short never corrupts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import StateDamagedError
from gateway.panel.carried import CarryBlock
from gateway.panel.roster import (
    Outcome,
    Roster,
    Sealer,
    drop_roster_draws,
    read_roster,
    roster_entries,
    roster_key,
)
from gateway.state_store.state_codec import decode_state, registry_counts
from gateway.state_store.state_keys import is_roster_key, state_key_partition

CANARY = "Canary-Value-7f3a"


def _roster() -> Roster:
    r = Roster()
    carry = CarryBlock(r.carried.names_id(["occ", "pay"]), [[CANARY], [1234.5]])
    for i in range(7):
        r.add(bytes([i]) * 32, i // 5, wave=1, claim=[40.0 + i, CANARY], carry=carry, sampling=2.0)
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
    assert (
        back.keys == [] and back.linked == [] and not len(back.carried) and back.last_wave is None
    )


# -- a roster written in parts -------------------------------------------------------------
COLUMNS = (
    "keys",
    "cohort",
    "active",
    "streak",
    "seen",
    "linked",
    "carried",
    "next_cohort",
    "draws",
)


def _grown(members: int, seed: int) -> Roster:
    """A roster of ``members`` with carried values of varied sizes and a decided wave."""
    rng = np.random.default_rng(seed)
    r = Roster()
    texts = [CANARY * int(rng.integers(0, 4)) for _ in range(members)]
    r.add_many(
        [i.to_bytes(32, "big") for i in range(members)],
        [i // 3 for i in range(members)],
        wave=1,
        claim=[[float(i) for i in range(members)], texts],
        carry=CarryBlock(r.carried.names_id(["occ"]), [texts]),
        sampling=[1.5] * members,
    )
    r.linked = [{i - i % 3, i - i % 3 + 1} for i in range(members)]
    r.decided(Outcome(1, np.arange(members, dtype=np.int32) // 3, [[1.0, "x"]], [2.0]))
    digests = [(bytes([j]) * 16, (bytes([j]) * 16).hex()) for j in rng.integers(0, 9, members)]
    r.draws.put("rr", "income", r.keys, digests, [[">50K", "v1"]] * members)
    r.draws.put("noise", "pay", r.keys[::2], digests[::2], rng.normal(size=members)[::2].tolist())
    return r


class _Dict(dict[bytes, bytes]):
    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return {k: self[k] for k in keys if k in self}


def _same(a: Roster, b: Roster) -> None:
    for name in COLUMNS:
        assert getattr(a, name) == getattr(b, name), name
    assert [o.class_of.tolist() for o in a.outcomes] == [o.class_of.tolist() for o in b.outcomes]


@settings(max_examples=40, deadline=None)
@given(
    members=st.integers(0, 60),
    part_bytes=st.integers(64, 4096),
    scope=st.sampled_from([None, 0, 7]),
    seed=st.integers(0, 2**16),
)
def test_a_roster_round_trips_through_parts_that_stay_with_it(
    members: int, part_bytes: int, scope: int | None, seed: int
) -> None:
    """Whatever its size: every entry within the part size (a head's few fields aside), every
    entry routed to the roster's partition and left alone by migrations and audits as the
    roster is, and the roster read back whole, counters included."""
    sealer, key = Sealer(b"k" * 32), roster_key(scope)
    r = _grown(members, seed)
    entries = roster_entries(r, sealer, key, part_bytes=part_bytes)
    body = r.encode(sealer, key)
    if len(body) <= part_bytes:  # the whole entry, as rosters were always written
        assert entries == {key: body}
    else:
        assert list(entries)[-1] == key  # the head last
        assert sum(1 for k in entries if k != key) == -(-len(body) // part_bytes)
    for k, v in entries.items():
        assert len(v) <= part_bytes + 128, "a part above the part size"
        assert is_roster_key(k) and state_key_partition(k) == scope
        decode_state(v)  # the changelog's restore audit decodes every value
        assert CANARY.encode() not in v
    assert registry_counts(entries[key]) == (members, members)
    store = _Dict(entries)
    back = read_roster(store.get_many, key, sealer)
    _same(back, r)


@settings(max_examples=40, deadline=None)
@given(members=st.integers(20, 60), cut=st.integers(0, 200), seed=st.integers(0, 2**16))
def test_a_write_cut_short_leaves_the_previous_roster_or_is_refused(
    members: int, cut: int, seed: int
) -> None:
    """Two writes in parts; the second applied in order up to ``cut`` entries (a changelog
    write cut short): the reader gets the first roster, or the second once its head is in, and
    a head whose parts are not all there is refused, never read as a roster."""
    sealer, key, part_bytes = Sealer(b"k" * 32), roster_key(1), 256
    first = _grown(members, seed)
    store = _Dict(roster_entries(first, sealer, key, part_bytes=part_bytes))
    loaded = read_roster(store.get_many, key, sealer)
    second = _grown(members + 5, seed + 1)
    second.generation = loaded.generation  # as the step writes the roster it loaded
    new = list(roster_entries(second, sealer, key, part_bytes=part_bytes).items())
    store.update(new[: min(cut, len(new))])
    back = read_roster(store.get_many, key, sealer)
    _same(back, second if cut >= len(new) else first)

    # the head in, a part of its slot missing: refused
    store.update(new)
    del store[new[min(cut, len(new) - 2)][0]]
    # a PrivgwError: its message crosses from the engine process ("restore from a backup")
    with pytest.raises(StateDamagedError, match="do not match its head"):
        read_roster(store.get_many, key, sealer)


@settings(max_examples=30, deadline=None)
@given(members=st.integers(0, 80), part_bytes=st.integers(256, 4096), seed=st.integers(0, 99))
def test_a_policy_upgrade_drops_an_attributes_draws_and_keeps_the_rest_of_the_roster(
    members: int, part_bytes: int, seed: int
) -> None:
    """Without the secret, whole or in parts (written to the other slot, head last): the
    roster reads back the same but for that attribute's draws, counted one a pair."""
    sealer, key = Sealer(b"k" * 32), roster_key(3)
    r = _grown(members, seed)
    store = _Dict(roster_entries(r, sealer, key, part_bytes=part_bytes))
    entries, gone = drop_roster_draws(
        store.get_many, key, ["income", "other"], part_bytes=part_bytes
    )
    assert gone == ({"income": members} if members else {})
    store.update(entries)
    back = read_roster(store.get_many, key, sealer)
    r.draws.drop(["income"])
    _same(back, r)
    assert ("rr", "income") not in back.draws.columns
    if entries and len(entries) > 1:  # in parts: the next generation, in the other slot
        assert back.generation == 2 and list(entries)[-1] == key
    assert drop_roster_draws(store.get_many, key, ["income"], part_bytes=part_bytes) == ({}, {})


def test_a_roster_stored_whole_is_read_and_then_written_in_parts() -> None:
    """State written before parts (one entry, however large) reads as it did, and the next
    write of a roster above the part size goes to parts."""
    sealer, key = Sealer(b"k" * 32), roster_key(2)
    r = _grown(200, 1)
    store = _Dict({key: r.encode(sealer, key)})  # the format before parts
    back = read_roster(store.get_many, key, sealer)
    _same(back, r)
    assert back.generation == 0
    store.update(roster_entries(back, sealer, key, part_bytes=1024))
    again = read_roster(store.get_many, key, sealer)
    _same(again, r)
    assert again.generation == 1


def test_a_migration_and_an_audit_leave_a_roster_s_parts_alone() -> None:
    from gateway.policy.migration import MigrationPlan, groups_to_drop  # noqa: PLC0415
    from gateway.state_store.live_counts import audit_live_counts  # noqa: PLC0415

    sealer, key = Sealer(b"k" * 32), roster_key(2)
    entries = list(roster_entries(_grown(100, 3), sealer, key, part_bytes=512).items())
    assert len(entries) > 2
    dropped, rows, seen = groups_to_drop(entries, MigrationPlan(regroup_all=True))
    assert (dropped, rows, seen) == (set(), {}, 0)
    audit = audit_live_counts(entries)
    assert not audit.drifted and audit.groups == 0 and audit.respondents == 0


def test_a_migration_that_raises_k_says_what_becomes_of_a_panel(tmp_path: Path) -> None:
    """`state migrate` and `--policy-upgrade` reported "0 of 0 groups re-formed ... 0
    respondents" for a panel of 300 members whose k rose: its cohorts merge at the next wave,
    and its linked sets stay at the k of its history, which the report now says."""
    from gateway.policy.migration import MigrationPlan  # noqa: PLC0415
    from state.policy_record import migrate_store  # noqa: PLC0415
    from state.sqlite_store import SQLiteStore  # noqa: PLC0415

    sealer, key = Sealer(b"k" * 32), roster_key(None)
    roster = _grown(100, 3)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.put_many(roster_entries(roster, sealer, key, part_bytes=512))
        report = migrate_store(store, MigrationPlan(min_group_size=6), dry_run=True)
    assert report.panel_members == sum(roster.active) > 0
    assert "merge whole at the next wave" in report.text()

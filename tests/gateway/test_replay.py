"""What a respondent's state keeps of its records' outcomes for replays
(gateway.grouping.replay): found by record id and values, dropped once committed, bounded."""

from __future__ import annotations

from typing import Any

from gateway.grouping.registry import TUPLES_KEPT, Group
from gateway.grouping.replay import KEPT, recall, remember


def test_an_outcome_is_found_by_its_record_and_values_only() -> None:
    state: dict[str, Any] = {}
    remember(state, "in/0/7", "aaaaaaaa11", ("g1", "2"), {})
    remember(state, "in/0/8", "bbbbbbbb22", None, {})
    assert recall(state, "in/0/7", "aaaaaaaa11") == ("g1", "2")
    assert recall(state, "in/0/8", "bbbbbbbb22") is None  # published suppressed
    assert recall(state, "in/0/9", "aaaaaaaa11") is False  # another record
    # the same id with other values (a topic recreated since): not the record it names
    assert recall(state, "in/0/7", "cccccccc11") is False


def test_committed_records_are_dropped_when_the_state_is_written() -> None:
    state: dict[str, Any] = {}
    remember(state, "in.a/0/5", "d" * 8, ("g1", "1"), {})
    remember(state, "in.a/1/5", "e" * 8, ("g1", "1"), {})
    remember(state, "in.a/0/9", "f" * 8, ("g2", "2"), {("in.a", 0): 6})
    # partition 0 is committed past 5, partition 1 is not known to be
    assert [e[0] for e in state["p"]] == ["in.a/1/5", "in.a/0/9"]
    remember(state, "file-row-3", "g" * 8, ("g3", "3"), {("in.a", 1): 99})
    assert [e[0] for e in state["p"]] == ["in.a/0/9", "file-row-3"]


def test_without_commits_a_state_keeps_the_newest_entries() -> None:
    state: dict[str, Any] = {}
    for offset in range(KEPT + 3):
        remember(state, f"in/0/{offset}", "d" * 8, ("g", str(offset)), {})
    assert [e[0] for e in state["p"]] == [f"in/0/{o}" for o in range(3, KEPT + 3)]
    remember(state, "in/0/5", "d" * 8, ("g", "again"), {})  # the same record decided again
    assert sum(e[0] == "in/0/5" for e in state["p"]) == 1
    assert recall(state, "in/0/5", "d" * 8) == ("g", "again")


def test_a_group_keeps_the_tuples_it_replaced_through_its_stored_form() -> None:
    grp = Group.formed([30.0, "F"], [b"a" * 16, b"b" * 16], "1")
    for release, tuple_ in (("2", [31.0, "F"]), ("3", [32.5, "F"])):
        grp.retune(release)
        grp.tuple_ = tuple_
    stored = Group.from_doc(grp.to_doc())
    assert stored is not None
    assert stored.tuple_at("3") == [32.5, "F"]
    assert stored.tuple_at("2") == [31.0, "F"]
    assert stored.tuple_at("1") == [30.0, "F"]
    for release in range(4, 4 + TUPLES_KEPT):
        stored.retune(str(release))
    assert stored.tuple_at("1") is None  # beyond what it keeps: decided again

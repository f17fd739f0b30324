"""What a roster's rows are carried forward with, as columns (gateway/panel/carried.py): any
sequence of new rows, overwritten rows and aged categories leaves every row as a list of rows
kept by hand would, through its bytes and from the rows rosters wrote before."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.panel.carried import Carried, CarryBlock

NAMES = [["occ", "pay"], ["occ"], ["pay", "occ", "\x00pseudonym"]]
VALUE = st.one_of(st.none(), st.sampled_from(["a", "b", 1, 1.0, -0.0, 0.0]), st.floats(-5, 5))


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Steps: ("new", rows) | ("set", rows at existing positions) | ("age", positions)."""
    steps: list[tuple[str, Any]] = []
    n = 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["new", "set", "age"])) if n else "new"
        if kind == "new":
            size = draw(st.integers(0, 5))
            n += size
        else:
            size = draw(st.integers(0, n))
        names = draw(st.sampled_from(range(len(NAMES))))
        rows = [
            (
                [draw(st.floats(0, 99)), draw(st.sampled_from(["x", "y", None]))],
                [draw(VALUE) for _ in NAMES[names]],
                draw(st.floats(0.5, 9)),
            )
            for _ in range(size)
        ]
        at = draw(st.permutations(range(n)))[:size] if kind != "new" else []
        steps.append((kind, (names, rows, at, draw(st.integers(1, 9)))))
    return steps


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and repr(a) == repr(b)


@given(batches())
@settings(max_examples=200, deadline=None)
def test_columns_keep_what_rows_kept_by_hand_would(steps: list[tuple[str, Any]]) -> None:
    carried, model = Carried(), []
    for kind, (which, rows, at, wave) in steps:
        names = NAMES[which]
        nid = carried.names_id(names)
        claim = [[r[0][j] for r in rows] for j in range(2)]
        block = CarryBlock(nid, [[r[1][j] for r in rows] for j in range(len(names))])
        weights = [r[2] for r in rows]
        if kind == "new":
            carried.extend(claim, block, weights, wave)
            model += [[r[0], dict(zip(names, r[1], strict=True)), r[2], wave] for r in rows]
        elif kind == "set":
            carried.assign(np.asarray(at, dtype=np.intp), claim, block, weights, wave)
            for row, r in zip(at, rows, strict=True):
                model[row] = [r[0], dict(zip(names, r[1], strict=True)), r[2], wave]
        else:  # the category aged, the rest kept
            carried.set_claim(1, np.asarray(at, dtype=np.intp), claim[1])
            for row, r in zip(at, rows, strict=True):
                model[row][0] = [model[row][0][0], r[0][1]]
    again = Carried.from_doc(msgspec.msgpack.decode(msgspec.msgpack.encode(carried.to_doc())))
    lists = [
        [c, [carried.nid.tolist()[i], *m.values()], w, o]
        for i, (c, m, w, o) in enumerate(carried.rows_as_lists())
    ]
    earlier = Carried.from_rows(
        msgspec.msgpack.decode(msgspec.msgpack.encode(lists)), carried.names
    )
    for version in (carried, again, earlier):
        got = version.rows_as_lists()
        assert len(got) == len(model)
        for mine, want in zip(got, model, strict=True):
            assert [_same(a, b) for a, b in zip(mine[0], want[0], strict=True)] == [True, True]
            assert list(mine[1]) == list(want[1])  # the row's names, in order
            assert all(_same(mine[1][k], want[1][k]) for k in want[1])
            assert mine[2:] == want[2:]
    rows = np.arange(len(model), dtype=np.intp)
    assert carried.combos(rows, [1]) == [(r[0][1],) for r in model]
    assert carried.claim_rows(rows) == [r[0] for r in model]

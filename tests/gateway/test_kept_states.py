"""Decoded states kept between windows (gateway/state_store/kept_states.py): whatever happens to
the store between and during windows (the engine's own writes, another engine's, erasures, a
window that fails before its write), a state read is always what decoding the stored bytes
gives, and what the window then writes is what it would write without keeping."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.state_store.kept_states import KeptStates
from gateway.state_store.state_codec import decode_state, encode_state

KEYS = [bytes([i]) * 32 for i in range(6)]

draws = st.dictionaries(
    st.text("0123456789abcdef", min_size=4, max_size=4),
    st.one_of(st.floats(allow_nan=False), st.text(max_size=3)),
    max_size=3,
)
# a respondent's state as the sticky draws hold it: kind -> attribute -> value digest -> draw
states = st.fixed_dictionaries({"rr": st.dictionaries(st.sampled_from("ab"), draws, max_size=2)})

# one step: the engine's window (reads these keys, changes some, writes them, or fails before
# writing), or another writer (another engine's window, an erasure)
windows = st.tuples(
    st.just("window"),
    st.lists(st.sampled_from(KEYS), max_size=6),
    st.lists(st.tuples(st.sampled_from(KEYS), states), max_size=3),
    st.booleans(),  # fails before its write
)
others = st.tuples(
    st.just("other"),
    st.lists(st.sampled_from(KEYS), max_size=3),
    st.lists(st.tuples(st.sampled_from(KEYS), states), max_size=3),
    st.booleans(),  # erases the keys instead of writing
)


@given(st.lists(st.one_of(windows, others), max_size=25), st.sampled_from([0, 3, 1000]))
@settings(max_examples=200, deadline=None)
def test_a_kept_state_is_always_what_the_stored_bytes_decode_to(
    steps: list[tuple[str, list[bytes], list[tuple[bytes, dict[str, Any]]], bool]], limit: int
) -> None:
    store: dict[bytes, bytes] = {}
    kept = KeptStates(limit=limit)
    for kind, keys, changes, flag in steps:
        if kind == "other":
            if flag:
                for key in keys:
                    store.pop(key, None)
            else:
                store.update((key, encode_state(state)) for key, state in changes)
            continue
        found = {key: store[key] for key in sorted(set(keys)) if key in store}
        read = kept.decoded(found)
        assert read == {key: decode_state(raw) for key, raw in found.items()}
        touched: set[bytes] = set()
        for key, change in changes:  # the window's fresh draws, into its states in place
            state = read.setdefault(key, {})
            for attribute, values in change["rr"].items():
                state.setdefault("rr", {}).setdefault(attribute, {}).update(values)
            touched.add(key)
        if flag:
            continue  # failed: nothing written, nothing kept
        entries = {key: encode_state(read[key]) for key in touched}
        store.update(entries)
        kept.written(read, entries)
        assert len(kept) <= limit

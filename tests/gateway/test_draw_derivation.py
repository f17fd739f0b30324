"""Keyed draws under two derivations, one per deployment (issue 33, item 3).

The AES derivation is checked against an independent reference (the CBC mode of
``cryptography`` and RFC 5869 written out with ``hmac``), for determinism whatever the batch,
and statistically; the pin (which derivation an engine uses) against states of every kind.
States written by the version before derivations were recorded are in
test_draw_upgrade.py.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.engine.shards import ShardedEngine, route
from gateway.keyed.draw_derivation import (
    META_NAME,
    NEW_DEPLOYMENTS,
    DrawDerivation,
    DrawDerivationError,
    check_parts,
    settle,
)
from gateway.keyed.keyed import KeyedSource, Keyring
from gateway.policy import policy_from_yaml
from state.memory_store import MemoryStore
from state.sqlite_store import SQLiteStore

SECRET = b"draw-derivation-secret-0123456789"
AES = DrawDerivation.AES_CBC_MAC
HMAC = DrawDerivation.HMAC_SHA256
ALPHA = 1e-3  # family-wise: every statistical check below fails a correct source this rarely

POLICY = policy_from_yaml(
    """
input: {respondent_id: rid}
window: {max_records: 100000, max_seconds: 1, max_hold_seconds: 10, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.5}
  # an absolute sd: a noise ratio scales by the window's spread, which a replay cut into
  # other windows changes (the draws themselves do not)
  pay: {role: sensitive, type: numeric, method: noise, noise: {sd: 2000}}
"""
)


# -- the AES derivation against a reference written apart -------------------------------------
def _hkdf(secret: bytes, salt: bytes, info: bytes) -> bytes:
    prk = hmac.new(salt, secret, hashlib.sha256).digest()  # RFC 5869, 2.2
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()  # 2.3, one block of 32


def _reference(secret: bytes, purpose: str, key: bytes) -> float:
    """The documented draw: the last block of AES-CBC (zero IV) over B0 || key || zeros."""
    aes_key = _hkdf(secret, b"privgw/v2/draw", purpose.encode())
    padded = key + b"\x00" * (-len(key) % 16)
    message = len(key).to_bytes(8, "big") + b"privgw02" + padded
    enc = Cipher(algorithms.AES(aes_key), modes.CBC(b"\x00" * 16)).encryptor()
    mac = (enc.update(message) + enc.finalize())[-16:]
    return (int.from_bytes(mac[:8], "big") >> 11) * 2.0**-53


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=70), min_size=1, max_size=12),
    st.text(min_size=1, max_size=20).filter(lambda p: "\x00" not in p),
)
def test_aes_draws_are_the_documented_cbc_mac(keys: list[bytes], purpose: str) -> None:
    got = KeyedSource(Keyring(SECRET), AES).uniform(purpose, len(keys), keys)
    assert got.tolist() == [_reference(SECRET, purpose, k) for k in keys]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=48, max_size=48), min_size=2, max_size=30, unique=True))
def test_a_draw_depends_on_its_key_alone_not_on_the_batch(keys: list[bytes]) -> None:
    """Any window cut or record order gives a key the same draw (a replay with other cuts)."""
    source = KeyedSource(Keyring(SECRET), AES)
    whole = dict(zip(keys, source.uniform("rr/occ", len(keys), keys).tolist(), strict=True))
    backwards = keys[::-1]
    assert source.uniform("rr/occ", len(keys), backwards).tolist() == [whole[k] for k in backwards]
    half = keys[: len(keys) // 2]
    assert source.uniform("rr/occ", len(half), half).tolist() == [whole[k] for k in half]
    fresh = KeyedSource(Keyring(SECRET), AES)  # a restarted process
    assert fresh.uniform("rr/occ", 1, keys[-1:]).tolist() == [whole[keys[-1]]]


def test_a_derivation_given_by_its_name_draws_with_it() -> None:
    """The name (as a setting or a record carries it) is the derivation, not a fallback."""
    keys = [bytes([i]) * 48 for i in range(8)]
    for d in DrawDerivation:
        named = KeyedSource(Keyring(SECRET), d.value)  # type: ignore[arg-type]
        assert named.derivation is d
        assert named.uniform("rr/occ", 8, keys).tolist() == (
            KeyedSource(Keyring(SECRET), d).uniform("rr/occ", 8, keys).tolist()
        )
    aes = KeyedSource(Keyring(SECRET), AES).uniform("rr/occ", 8, keys)
    assert aes.tolist() == [_reference(SECRET, "rr/occ", k) for k in keys]


def test_keys_that_are_not_bytes_are_refused() -> None:
    for d in DrawDerivation:
        with pytest.raises(TypeError, match="must be bytes"):
            KeyedSource(Keyring(SECRET), d).uniform("rr/occ", 2, [b"x" * 48, "y" * 48])  # type: ignore[list-item]


def test_purposes_secrets_and_derivations_give_unrelated_draws() -> None:
    rng = np.random.default_rng(3)
    keys = [rng.bytes(48) for _ in range(2000)]
    aes = KeyedSource(Keyring(SECRET), AES)
    base = aes.uniform("noise/pay/1", len(keys), keys)
    others = {
        "purpose": aes.uniform("noise/pay/2", len(keys), keys),
        "secret": KeyedSource(Keyring(SECRET + b"!"), AES).uniform("noise/pay/1", 2000, keys),
        "derivation": KeyedSource(Keyring(SECRET), HMAC).uniform("noise/pay/1", 2000, keys),
    }
    # independent uniforms: the correlation of n pairs is ~N(0, 1/n) (Bonferroni over 3)
    z = stats.norm.ppf(1 - ALPHA / 6)
    for name, other in others.items():
        assert not np.any(other == base), name
        r = np.corrcoef(base, other)[0, 1]
        assert abs(r) < z / math.sqrt(len(keys)), (name, r)


def test_aes_draws_are_uniform() -> None:
    """Bin counts within the binomial standard error, the mean within its standard error and
    a KS test, each at ALPHA / 3 (the tolerances follow from n, nothing hand-picked)."""
    n, bins = 40_000, 20
    rng = np.random.default_rng(11)
    keys = [rng.bytes(48) for _ in range(n)]
    u = KeyedSource(Keyring(SECRET), AES).uniform("rr/occ", n, keys)
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.bincount((u * bins).astype(int), minlength=bins)
    p = 1 / bins
    z_bins = stats.norm.ppf(1 - ALPHA / 3 / (2 * bins))
    assert np.all(np.abs(counts - n * p) <= z_bins * math.sqrt(n * p * (1 - p))), counts
    z = stats.norm.ppf(1 - ALPHA / 3 / 2)
    assert abs(u.mean() - 0.5) <= z * math.sqrt(1 / 12 / n)
    assert stats.kstest(u, "uniform").pvalue > ALPHA / 3


def _records(values: dict[str, dict[str, Any]], offset: int = 0) -> list[ValidRecord]:
    return [
        ValidRecord(rid, v, SourceRef("in", 0, offset + i), 0.0)
        for i, (rid, v) in enumerate(values.items())
    ]


def _panel(n: int, seed: int = 5, occ: str | None = None) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return {
        f"r{i}": {
            "age": int(rng.integers(18, 90)),
            "occ": occ or str(rng.choice(list("abcd"))),
            "pay": round(float(rng.uniform(1000, 90000)), 2),
        }
        for i in range(n)
    }


def test_randomized_response_keeps_its_retention_under_aes_draws() -> None:
    """The published share of the true category is P[i][i] of the matrix, within its binomial
    standard error, for every true category."""
    engine = Engine(POLICY, keyring=Keyring(SECRET), store=MemoryStore(), draws=AES)
    assert engine.draws is AES
    mech = engine.mechanisms["occ"]
    n = 3000
    z = stats.norm.ppf(1 - ALPHA / 2 / len(mech.categories))
    for j, cat in enumerate(mech.categories):
        truth = {f"{cat}{i}": v for i, v in enumerate(_panel(n, seed=j, occ=cat).values())}
        records = _records(truth)
        out = engine.protect_window(records, now=0.0, flush_all=True)
        kept = sum(1 for occ, _ in _published(out, records).values() if occ == cat) / n
        p_keep = float(mech.matrix[j, j])
        assert abs(kept - p_keep) <= z * math.sqrt(p_keep * (1 - p_keep) / n), (cat, kept)


# -- one derivation per state -------------------------------------------------------------
def _published(result: Any, records: list[ValidRecord]) -> dict[str, tuple[Any, Any]]:
    """Respondent -> its published (occ, pay) as published (JSON bytes' values)."""
    owner = {r.source.record_id: r.respondent_id for r in records if r.source is not None}
    out = {}
    for p in result.published:
        doc = orjson.loads(p.value)
        out[str(owner[p.record_id])] = (doc["occ"], doc["pay"])
    return out


def test_a_fresh_state_records_the_new_derivation_with_its_first_window(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(POLICY, keyring=Keyring(SECRET), store=store)
        assert engine.draws is NEW_DEPLOYMENTS is AES
        assert store.meta(META_NAME) is None and engine.draws_bound() is None  # not yet
        engine.protect_window(_records(_panel(30)), now=0.0, flush_all=True)
        assert store.meta(META_NAME) == AES.value and engine.draws_bound() is AES
        assert engine.metadata()[META_NAME] == AES.value
    with SQLiteStore(tmp_path / "s.db") as store:  # a restart keeps it
        assert Engine(POLICY, keyring=Keyring(SECRET), store=store).draws_bound() is AES
        with pytest.raises(DrawDerivationError, match=r"aes-256-cbc-mac derivation.*hmac-sha256"):
            Engine(POLICY, keyring=Keyring(SECRET), store=store, draws=HMAC)


def test_a_state_with_entries_and_no_record_keeps_hmac(tmp_path: Path) -> None:
    """What every state written before derivations were recorded looks like."""
    store = MemoryStore()
    Engine(POLICY, keyring=Keyring(SECRET), store=store, draws=HMAC).protect_window(
        _records(_panel(30)), now=0.0, flush_all=True
    )
    store._meta.clear()  # as the earlier version left it: entries, no derivation
    engine = Engine(POLICY, keyring=Keyring(SECRET), store=store)
    assert engine.draws is HMAC and engine.draws_bound() is HMAC
    with pytest.raises(DrawDerivationError):
        engine.use_draws(AES)  # the topic of another deployment, say
    with pytest.raises(DrawDerivationError):
        Engine(POLICY, keyring=Keyring(SECRET), store=store, draws=AES)


def test_a_fresh_state_takes_the_announced_derivation_and_replays_byte_identical() -> None:
    """A deployment that lost its state: the metadata topic's derivation gives the draws it
    published before, whichever derivation that is."""
    panel = _panel(60)
    records = _records(panel)
    for derivation in DrawDerivation:
        first = Engine(POLICY, keyring=Keyring(SECRET), store=MemoryStore(), draws=derivation)
        before = first.protect_window(records, now=0.0, flush_all=True)
        lost = Engine(POLICY, keyring=Keyring(SECRET), store=MemoryStore())
        assert settle([lost], derivation, where="test") is derivation
        assert lost.metadata()[META_NAME] == derivation.value
        again = lost.protect_window(records, now=0.0, flush_all=True)
        assert [p.value for p in again.published] == [p.value for p in before.published]
    aes_run, hmac_run = (
        _published(
            Engine(POLICY, keyring=Keyring(SECRET), store=MemoryStore(), draws=d).protect_window(
                records, now=0.0, flush_all=True
            ),
            records,
        )
        for d in (AES, HMAC)
    )
    assert aes_run != hmac_run  # so the equalities above say which derivation drew


def test_aes_draws_replay_identically_after_a_lost_state_across_window_cuts_and_shards(
    tmp_path: Path,
) -> None:
    """Three waves in windows of 500 on one engine; the same waves after losing the state, in
    windows of 170 over 3 shards: every randomized and noised value is the same (groups may
    differ: they depend on the window)."""
    panel = _panel(900, seed=9)
    rng = np.random.default_rng(2)
    waves = [panel]
    for _ in range(2):  # some values change between waves: fresh draws, still keyed
        nxt = {rid: dict(v) for rid, v in waves[-1].items()}
        for rid in rng.choice(list(nxt), 150, replace=False):
            nxt[str(rid)]["occ"] = str(rng.choice(list("abcd")))
            nxt[str(rid)]["pay"] = round(float(rng.uniform(1000, 90000)), 2)
        waves.append(nxt)

    def run(engine: Any, cut: int) -> dict[tuple[int, str], tuple[Any, Any]]:
        out: dict[tuple[int, str], tuple[Any, Any]] = {}
        for w, truth in enumerate(waves):
            records = _records(truth, offset=10_000 * w)
            for start in range(0, len(records), cut):
                part = records[start : start + cut]
                res = engine.protect_window(part, now=float(w), flush_all=True)
                out.update({(w, rid): v for rid, v in _published(res, part).items()})
        return out

    with SQLiteStore(tmp_path / "one.db") as store:
        one = Engine(POLICY, keyring=Keyring(SECRET), store=store)
        first = run(one, 500)
        assert store.meta(META_NAME) == AES.value
    stores = [SQLiteStore(tmp_path / f"shard{i}.db") for i in range(3)]
    try:
        sharded = ShardedEngine(
            [Engine(POLICY, keyring=Keyring(SECRET), store=s, measure_risk=False) for s in stores]
        )
        assert settle([sharded], AES, where="test") is AES  # as the topic announces
        replay = run(sharded, 170)
        assert [s.meta(META_NAME) for s in stores] == [AES.value] * 3
        assert all(part for part in route(_records(panel), 3))  # every shard had records
    finally:
        for s in stores:
            s.close()
    assert len(first) == 3 * len(panel)
    assert replay == first


def test_shards_settle_on_the_derivation_their_states_bind(tmp_path: Path) -> None:
    """One shard written before records (HMAC), one fresh: both draw HMAC. Two shards bound
    to different derivations are refused."""
    legacy = MemoryStore()
    Engine(POLICY, keyring=Keyring(SECRET), store=legacy, draws=HMAC).protect_window(
        _records(_panel(9)), now=0.0, flush_all=True
    )
    legacy._meta.clear()
    fresh = MemoryStore()
    sharded = ShardedEngine(
        [
            Engine(POLICY, keyring=Keyring(SECRET), store=s, measure_risk=False)
            for s in (fresh, legacy)
        ]
    )
    assert [e.draws for e in sharded.engines] == [HMAC, HMAC]
    assert sharded.draws_bound() is HMAC
    with pytest.raises(DrawDerivationError, match="record different draw derivations"):
        settle([sharded], AES, where="the test's state and topic")

    bound_aes = MemoryStore()
    bound_aes.set_meta(META_NAME, AES.value)
    with pytest.raises(DrawDerivationError, match="engine shards"):
        ShardedEngine(
            [
                Engine(POLICY, keyring=Keyring(SECRET), store=s, measure_risk=False)
                for s in (bound_aes, legacy)
            ]
        )


def test_an_unknown_recorded_derivation_is_refused_naming_it() -> None:
    store = MemoryStore()
    store.set_meta(META_NAME, "rot13")
    with pytest.raises(DrawDerivationError, match=r"'rot13'.*does not know"):
        Engine(POLICY, keyring=Keyring(SECRET), store=store)


def test_engines_that_do_not_draw_keyed_say_nothing_about_a_derivation() -> None:
    from gateway.keyed.randomness import SeededSource  # noqa: PLC0415

    seeded = Engine(POLICY, randomness=SeededSource(1), consistency_override=True)
    assert seeded.draws is None and META_NAME not in seeded.metadata()
    assert settle([seeded], AES, where="test") is None


def test_parts_restored_later_are_checked_and_recorded() -> None:
    """Partitions of the partitioned backend: checked against the settled derivation."""
    fresh, legacy, bound = MemoryStore(), MemoryStore(), MemoryStore()
    legacy.put_many({b"k" * 32: b"v"})
    bound.set_meta(META_NAME, HMAC.value)
    assert check_parts([fresh], AES, where="partition 0") == 1
    assert fresh.meta(META_NAME) == AES.value
    with pytest.raises(DrawDerivationError, match="partition 1"):
        check_parts([legacy], AES, where="partition 1")
    assert legacy.meta(META_NAME) is None  # nothing written when refused
    assert check_parts([legacy, bound], HMAC, where="partitions 1, 2") == 1
    assert legacy.meta(META_NAME) == HMAC.value

"""Each published attribute's values for a window: its protection method applied —
randomized response, noise, top/bottom coding, generalization, coarsening, rounding or keep —
with a sticky engine's draws looked up in the respondents' states and the fresh ones stored
there (keyed by the digest of the true value, so the same value republishes the same draw)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import orjson
from numpy.typing import NDArray

from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView
from gateway.mechanisms import masking
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.stamp import stamp_column
from gateway.policy import MISSING_LABEL, Method, Policy, Role
from gateway.randomness import UniformSource, normals_from_uniforms
from gateway.records import ValidRecord, attribute_values


def mechanism_version(mech: RRMechanism) -> str:
    return hashlib.sha256(orjson.dumps(mech.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()[
        :12
    ]


@dataclass(frozen=True, slots=True)
class WindowInputs:
    """A window's records and what the engine derived from them before grouping."""

    records: Sequence[ValidRecord]
    rids: list[str]
    by_attribute: Mapping[str, Sequence[Any]] | None
    rkeys: list[bytes | None]  # respondent state keys
    dkeys: Sequence[bytes | None]  # what keyed draws are bound to
    view: StateView


@dataclass(slots=True)
class Output:
    """The published records' values by column (names, one list per name), the output
    records' keys, sticky hits, and randomized response's retention per attribute."""

    names: list[str]
    columns: list[list[Any]]
    keys: list[bytes | None]
    hits: int
    retention: dict[str, float] = field(default_factory=dict)
    randomized: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, column: list[Any]) -> None:
        self.names.append(name)
        self.columns.append(column)


class PublishedColumns:
    """The policy's published attributes, protected a column at a time. ``rand``: where draws
    come from (keyed for a sticky engine; replaced when the deployment settles its draws);
    ``stores``: a sticky engine with a state store, which keeps every fresh draw."""

    def __init__(
        self,
        policy: Policy,
        *,
        mechanisms: Mapping[str, RRMechanism],
        rand: UniformSource,
        stores: bool,
        ldiv: str | None,
        pseudonym: Callable[[str], str] | None,
    ) -> None:
        self.policy = policy
        self._pseudonym = pseudonym  # the output's pseudonym of a respondent id, if any
        self._claim = policy.k_claim
        self._published = [n for n, a in policy.attributes.items() if a.method is not Method.DROP]
        self.mechanisms = mechanisms
        self.rand = rand
        self._stores = stores
        self._ldiv = ldiv  # the l-diversity attribute, published before the grouping
        self.versions = {a: mechanism_version(m) for a, m in mechanisms.items()}
        self._codes = {a: {c: i for i, c in enumerate(m.categories)} for a, m in mechanisms.items()}

    def output(
        self,
        win: WindowInputs,
        qi: QIDecision,
        pub_idx: list[int],
        *,
        early: EarlyColumn | None,
        value_digests: Mapping[str, list[tuple[bytes, str]]],
    ) -> Output:
        """The published records' values, built column by column (then zipped into rows once,
        in C): ids, pseudonym, the k claim's tuples, every other attribute's mechanism."""
        records, view = win.records, win.view
        out = Output(
            names=["record_id", "policy_version"],
            columns=[[win.rids[i] for i in pub_idx], [self.policy.version] * len(pub_idx)],
            keys=[None] * len(pub_idx),
            hits=qi.hits,
        )
        pseudonym = self._pseudonym
        if pseudonym is not None:
            pseudonyms = [
                pseudonym(rid) if (rid := records[i].respondent_id) is not None else None
                for i in pub_idx
            ]
            out.add("pseudonym", pseudonyms)
            out.keys = [p.encode() if p else None for p in pseudonyms]
        qi_columns: dict[str, list[Any]] = {}
        if self._claim:  # the k claim's tuples, one column per attribute (None: not grouped)
            unset = (None,) * len(self._claim)
            chosen = [qi.tuples.get(i, unset) for i in pub_idx]
            qi_columns = {n: [] for n in self._claim}
            if chosen:
                by_name = map(list, zip(*chosen, strict=True))
                qi_columns = dict(zip(self._claim, by_name, strict=True))
        dk = [win.dkeys[i] for i in pub_idx]
        rk = [win.rkeys[i] for i in pub_idx]
        stored = StoredLookup(view.states, rk)
        suppressed = set(qi.suppressed)
        for name, values in zip(
            self._published,
            attribute_values(records, win.by_attribute, self._published, pub_idx),
            strict=True,
        ):
            attr = self.policy.attributes[name]
            ret: tuple[float, int] | None = None
            under: list[Any] | None = None  # randomized response: each value's matrix
            if name in qi_columns:
                column: list[Any] = qi_columns[name]
            elif early is not None and name == early.name:  # published before the grouping
                column = [early.out[i] for i in pub_idx]
                out.hits += sum(early.hit[i] for i in pub_idx)
                early.store(view, rk)
                if attr.method is Method.RANDOMIZED_RESPONSE:
                    ret = self.retention(name, values, column)
                under = None if early.under is None else [early.under[i] for i in pub_idx]
            else:
                column, hits, ret, under = self.column(
                    name,
                    values,
                    pub_idx,
                    dk=dk,
                    view=view,
                    stored=stored,
                    value_digests=value_digests,
                )
                out.hits += hits
            if ret is not None:
                out.retention[name], out.randomized[name] = ret
            if under is not None and self._stores:  # each value's matrix
                out.add(stamp_column(name), under)  # (gateway.mechanisms.stamp)
            if suppressed and attr.role is Role.QUASI_IDENTIFIER:
                column = [
                    None if i in suppressed else o for o, i in zip(column, pub_idx, strict=True)
                ]
            out.add(name, column)
        return out

    def column(
        self,
        name: str,
        values: list[Any],
        positions: Sequence[int],
        *,
        dk: Sequence[bytes | None],
        view: StateView,
        stored: StoredLookup,
        value_digests: Mapping[str, list[tuple[bytes, str]]],
    ) -> tuple[list[Any], int, tuple[float, int] | None, list[Any] | None]:
        """The published values of ``name`` for the records at ``positions`` (``values``, draw
        keys ``dk`` and stored publications aligned with them), with the sticky hits and, for
        randomized response, (retention, records randomized) and each value's matrix
        version."""
        attr = self.policy.attributes[name]
        if attr.method is Method.RANDOMIZED_RESPONSE:
            vds = _at(value_digests.get(name), positions)
            return self._randomize(name, values, dk, view, stored, digests=vds)
        if attr.method is Method.NOISE:
            vds = _at(value_digests.get(name), positions)
            out, hits = self._noise(name, values, dk, view, stored, digests=vds)
            return out, hits, None, None
        if attr.method is Method.TOP_BOTTOM_CODE:
            assert attr.coding is not None
            arr = np.array(values, dtype=np.float64)  # None -> nan
            coded = masking.top_bottom_code(arr, attr.coding)
            out = [None if v is None else _num(c) for v, c in zip(values, coded, strict=True)]
        elif attr.method is Method.GENERALIZE:
            assert attr.hierarchy is not None
            out = masking.generalize(
                [None if v is None else str(v) for v in values], attr.hierarchy
            )
        elif attr.method is Method.COARSEN:
            assert attr.coarsen is not None
            out = masking.coarsen(
                [None if v is None else str(v) for v in values], attr.coarsen.unit
            )
        elif attr.round_to is not None:  # a weight, rounded as the policy says
            arr = np.array([np.nan if v is None else float(v) for v in values])
            out = [_num(v) for v in masking.round_to(arr, attr.round_to).tolist()]
        else:  # keep
            out = values
        return out, 0, None, None

    def early(
        self,
        records: Sequence[ValidRecord],
        by_attribute: Mapping[str, Sequence[Any]] | None,
        *,
        rkeys: Sequence[bytes | None],
        dkeys: Sequence[bytes | None],
        view: StateView,
        value_digests: Mapping[str, list[tuple[bytes, str]]],
    ) -> EarlyColumn | None:
        """The l-diversity attribute's published values for every record of the window, taken
        before the grouping (which needs them) and reused for the records published. Sticky
        draws are keyed, so a held record's value now is the one it is published with later;
        fresh draws are kept aside and stored for the published records only."""
        if self._ldiv is None:
            return None
        name = self._ldiv
        everyone = range(len(records))
        values = attribute_values(records, by_attribute, [name])[0]
        stored = StoredLookup(view.states, rkeys)
        method = self.policy.attributes[name].method
        vds = value_digests.get(name)
        if view.sticky and vds is not None and method in (Method.RANDOMIZED_RESPONSE, Method.NOISE):
            maps = stored.maps("rr" if method is Method.RANDOMIZED_RESPONSE else "noise", name)
            hit = [m.get(h) is not None for m, (_, h) in zip(maps, vds, strict=True)]
        else:
            hit = [False] * len(records)
        aside = StateView(states={}, sticky=view.sticky)
        out, _, _, under = self.column(
            name, values, everyone, dk=dkeys, view=aside, stored=stored, value_digests=value_digests
        )
        return EarlyColumn(name, out, hit, aside.states, under)

    def retention(
        self, name: str, values: Sequence[object], out: Sequence[Any]
    ) -> tuple[float, int] | None:
        """(Share published as its true category, records randomized) of an RR attribute."""
        codes_of = self._codes[name]
        missing_code = codes_of.get(MISSING_LABEL, -1)
        codes = np.array([missing_code if v is None else codes_of[str(v)] for v in values])
        return _kept_share(codes_of, codes.astype(np.int64), out)

    def _randomize(
        self,
        name: str,
        values: Sequence[object],
        draw_keys: Sequence[bytes | None],
        view: StateView,
        stored: StoredLookup,
        *,
        digests: list[tuple[bytes, str]] | None,
    ) -> tuple[list[Any], int, tuple[float, int] | None, list[str | None]]:
        """The published values, sticky hits, retention, and the matrix version each value
        was drawn under (a stored draw keeps the version it was drawn with)."""
        mech = self.mechanisms[name]
        current = self.versions[name]
        codes_of = self._codes[name]
        missing_code = codes_of.get(MISSING_LABEL, -1)
        code_list = [missing_code if v is None else codes_of[str(v)] for v in values]
        codes = np.array(code_list, dtype=np.int64)
        out: list[Any]
        hits = 0
        if view.sticky and digests is not None:
            # one pass per step over the window rather than one loop with branches: the
            # respondent's stored publication of this value, else a fresh keyed draw
            vds = digests
            maps = stored.maps("rr", name)
            found = [
                m.get(hexed) if code >= 0 else None
                for m, (_, hexed), code in zip(maps, vds, code_list, strict=True)
            ]
            out = [None if f is None else f[0] for f in found]
            under: list[str | None] = [
                None if f is None else (f[1] if len(f) > 1 else None) for f in found
            ]
            fresh = [
                i
                for i, (f, code) in enumerate(zip(found, code_list, strict=True))
                if f is None and code >= 0
            ]
            hits = len(found) - found.count(None)
            fresh_keys = [(draw_keys[i] or b"") + vds[i][0] for i in fresh]
            u = self.rand.uniform(f"rr/{name}", len(fresh), fresh_keys) if fresh else np.empty(0)
        else:
            vds = []
            out = [None] * len(values)
            under = [None] * len(values)
            fresh = [i for i, code in enumerate(code_list) if code >= 0]
            u = self.rand.uniform(f"rr/{name}", len(fresh)) if fresh else np.empty(0)
        if fresh:
            categories = mech.categories
            labels = [categories[c] for c in mech.apply(codes[fresh], u).tolist()]
            drawn = [None if label == MISSING_LABEL else label for label in labels]
            for i, label in zip(fresh, drawn, strict=True):
                out[i] = label
                under[i] = current
            if self._stores and vds:
                self._store_drawn(
                    view,
                    "rr",
                    name,
                    keys=stored.keys,
                    digests=vds,
                    fresh=fresh,
                    drawn=drawn,
                    version=self.versions[name],
                )
        return out, hits, _kept_share(codes_of, codes, out), under

    def _noise(
        self,
        name: str,
        values: Sequence[object],
        draw_keys: Sequence[bytes | None],
        view: StateView,
        stored: StoredLookup,
        *,
        digests: list[tuple[bytes, str]] | None,
    ) -> tuple[list[Any], int]:
        attr = self.policy.attributes[name]
        assert attr.noise is not None
        arr = np.array([np.nan if v is None else float(v) for v in values])  # type: ignore[arg-type]
        if attr.coding is not None:  # top/bottom coding first, then noise on the coded values
            arr = masking.top_bottom_code(arr, attr.coding)
        sd = masking.noise_sd(arr, attr.noise)
        if sd <= 0.0:
            # nothing to scale the noise by (one value, no noise.sd): publish nothing rather
            # than the true value
            return [None] * len(values), 0
        out: list[Any]
        hits = 0
        if view.sticky and digests is not None:
            vds = digests
            maps = stored.maps("noise", name)
            found = [
                m.get(hexed) if v is not None else None
                for m, (_, hexed), v in zip(maps, vds, values, strict=True)
            ]
            out = found
            fresh = [
                i
                for i, (f, v) in enumerate(zip(found, values, strict=True))
                if f is None and v is not None
            ]
            hits = len(found) - found.count(None)
            fresh_keys = [(draw_keys[i] or b"") + vds[i][0] for i in fresh]
            u1 = self.rand.uniform(f"noise/{name}/1", len(fresh), fresh_keys)
            u2 = self.rand.uniform(f"noise/{name}/2", len(fresh), fresh_keys)
        else:
            vds = []
            out = [None] * len(values)
            fresh = [i for i, v in enumerate(values) if v is not None]
            u1 = self.rand.uniform(f"noise/{name}/1", len(fresh))
            u2 = self.rand.uniform(f"noise/{name}/2", len(fresh))
        step = attr.round_to
        if step is not None and hits:  # stored before the policy rounded: idempotent
            kept = np.array([np.nan if v is None else v for v in out], dtype=np.float64)
            out = [_num(v) for v in masking.round_to(kept, step).tolist()]
        if fresh:
            noisy = masking.add_noise(arr[fresh], sd, normals_from_uniforms(u1, u2))
            if step is not None:  # after the noise: the stored value is the published one
                noisy = masking.round_to(noisy, step)
            drawn = [_num(v) for v in noisy.tolist()]
            for i, v in zip(fresh, drawn, strict=True):
                out[i] = v
            if self._stores and vds:
                self._store_drawn(
                    view, "noise", name, keys=stored.keys, digests=vds, fresh=fresh, drawn=drawn
                )
        return out, hits

    @staticmethod
    def _store_drawn(
        view: StateView,
        kind: str,
        name: str,
        *,
        keys: Sequence[bytes | None],
        digests: Sequence[tuple[bytes, str]],
        fresh: Sequence[int],
        drawn: Sequence[Any],
        version: str | None = None,
    ) -> None:
        """Remember each respondent's fresh publication of a value (by its digest), so that
        the same value republishes it: ``[value, mechanism version]`` for randomized
        response, the value for noise."""
        states, touched = view.states, view.touched
        for i, value in zip(fresh, drawn, strict=True):
            key = keys[i]
            if key is not None:
                stored = value if version is None else [value, version]
                _stored_map(states, key, kind, name)[digests[i][1]] = stored
                touched.add(key)


_NOTHING: Mapping[str, Any] = {}  # the default of chained look-ups; never written to


class EarlyColumn(NamedTuple):
    """An attribute's published values for every record of a window, taken before the grouping
    (:meth:`PublishedColumns.early`); ``hit``: the value was stored already."""

    name: str
    out: list[Any]
    hit: list[bool]
    drawn: dict[bytes, dict[str, Any]]  # fresh draws by respondent key, as a state holds them
    under: list[Any] | None = None  # randomized response: each value's matrix version

    def store(self, view: StateView, keys: Iterable[bytes | None]) -> None:
        """Store the fresh draws of these respondents (the window's published ones)."""
        for key in keys:
            fresh = self.drawn.get(key) if key is not None else None
            if fresh is None or key is None:
                continue
            for kind, by_name in fresh.items():
                for name, values in by_name.items():
                    _stored_map(view.states, key, kind, name).update(values)
            view.touched.add(key)


def _kept_share(
    codes_of: Mapping[str, int], codes: NDArray[np.int64], out: Sequence[Any]
) -> tuple[float, int] | None:
    """Randomized response's retention: the share of the randomized records published as their
    true category (an unknown label: not kept), and how many were randomized."""
    published = np.array(
        [codes_of.get(MISSING_LABEL if o is None else o, -2) for o in out], dtype=np.int64
    )
    randomized = codes >= 0
    n = int(randomized.sum())
    return (float(np.mean(published[randomized] == codes[randomized])), n) if n else None


def _at(column: list[Any] | None, positions: Sequence[int]) -> list[Any] | None:
    """``column``'s entries at ``positions`` (None: no column)."""
    if column is None:
        return None
    if len(positions) == len(column):  # increasing and distinct: all of them
        return column
    return [column[i] for i in positions]


class StoredLookup:
    """Each record's stored publications, by kind ("rr", "noise") and attribute (by value
    digest; empty: none stored): the respondents' states are looked up once per window and
    each kind once, not once per attribute."""

    __slots__ = ("_kinds", "_states", "keys")

    def __init__(
        self, states: Mapping[bytes, Mapping[str, Any]], keys: Sequence[bytes | None]
    ) -> None:
        self.keys = keys  # the records' respondent keys (None: no respondent id)
        nothing = _NOTHING
        self._states = [nothing if key is None else states.get(key, nothing) for key in keys]
        self._kinds: dict[str, list[Mapping[str, Any]]] = {}

    def maps(self, kind: str, name: str) -> list[Mapping[str, Any]]:
        nothing = _NOTHING
        of_kind = self._kinds.get(kind)
        if of_kind is None:
            of_kind = self._kinds[kind] = [state.get(kind, nothing) for state in self._states]
        return [by_name.get(name, nothing) for by_name in of_kind]


def _stored_map(
    states: dict[bytes, dict[str, Any]], key: bytes, kind: str, name: str
) -> dict[str, Any]:
    """The respondent's stored values of ``kind`` for ``name``, created if absent."""
    state = states.get(key)
    if state is None:
        state = states[key] = {}
    by_name = state.get(kind)
    if by_name is None:
        by_name = state[kind] = {}
    values = by_name.get(name)
    if values is None:
        values = by_name[name] = {}
    return values


def _num(v: float | np.floating[Any]) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None

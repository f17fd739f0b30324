"""Each published attribute's values for a window: the k claim's tuples from the grouping,
every other attribute through its protection (:mod:`gateway.mechanisms.registry`, built once
from the policy), with a sticky engine's draws looked up in the respondents' states and the
fresh ones stored there (keyed by the digest of the true value, so the same value republishes
the same draw)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

from gateway.engine.records import Columns, ValidRecord, attribute_values
from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView
from gateway.keyed.randomness import UniformSource
from gateway.mechanisms.protection import Draws, Protection
from gateway.mechanisms.stamp import stamp_column
from gateway.mechanisms.sticky import stored_map
from gateway.policy import Method, Policy, Role


@dataclass(frozen=True, slots=True)
class WindowInputs:
    """A window's records and what the engine derived from them before grouping."""

    records: Sequence[ValidRecord]
    rids: list[str]
    columns: Columns  # the records' values (gateway.engine.records.window_columns)
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
    noise_sd: dict[str, float] = field(default_factory=dict)  # noise: the sd applied

    def add(self, name: str, column: list[Any]) -> None:
        self.names.append(name)
        self.columns.append(column)


class PublishedColumns:
    """The policy's published attributes, protected a column at a time. ``protections``: each
    attribute's outside the k claim (:func:`gateway.mechanisms.registry.protections`);
    ``rand``: where draws come from (keyed for a sticky engine; replaced when the deployment
    settles its draws); ``stores``: a sticky engine with a state store, which keeps every
    fresh draw."""

    def __init__(
        self,
        policy: Policy,
        *,
        protections: Mapping[str, Protection],
        rand: UniformSource,
        stores: bool,
        ldiv: str | None,
        pseudonym: Callable[[str], str] | None,
    ) -> None:
        self.policy = policy
        self._pseudonym = pseudonym  # the output's pseudonym of a respondent id, if any
        self._claim = policy.k_claim
        self._published = [n for n, a in policy.attributes.items() if a.method is not Method.DROP]
        self._qi = {n for n, a in policy.attributes.items() if a.role is Role.QUASI_IDENTIFIER}
        self.protections = protections
        self.rand = rand
        self._stores = stores
        self._ldiv = ldiv  # the l-diversity attribute, published before the grouping

    @property
    def pseudonym_of(self) -> Callable[[str], str] | None:
        """The output's pseudonym of a respondent id (None: the policy publishes none)."""
        return self._pseudonym

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
        in C): ids, pseudonym, the k claim's tuples, every other attribute's protection."""
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
        qi_columns = self._claim_columns(qi, pub_idx)
        rk = [win.rkeys[i] for i in pub_idx]
        draws = Draws(
            self.rand,
            [win.dkeys[i] for i in pub_idx],
            view.lookup(rk),
            view,
            self._stores,
            pub_idx,
            value_digests,
        )
        suppressed = set(qi.suppressed)
        for name, values in zip(
            self._published,
            attribute_values(win.columns, len(records), self._published, pub_idx),
            strict=True,
        ):
            ret: tuple[float, int] | None = None
            under: list[Any] | None = None  # randomized response: each value's matrix
            if name in qi_columns:
                column: list[Any] = qi_columns[name]
            elif early is not None and name == early.name:  # published before the grouping
                column = [early.out[i] for i in pub_idx]
                out.hits += sum(early.hit[i] for i in pub_idx)
                early.store(view, rk)
                ret = self.protections[name].retention(values, column)
                under = None if early.under is None else [early.under[i] for i in pub_idx]
            else:
                pub = self.protections[name].apply(values, draws)
                column, ret, under = pub.values, pub.retention, pub.under
                out.hits += pub.hits
                if pub.noise_sd is not None:
                    out.noise_sd[name] = pub.noise_sd
            if ret is not None:
                out.retention[name], out.randomized[name] = ret
            if under is not None and self._stores:  # each value's matrix
                out.add(stamp_column(name), under)  # (gateway.mechanisms.stamp)
            if suppressed and name in self._qi:
                column = [
                    None if i in suppressed else o for o, i in zip(column, pub_idx, strict=True)
                ]
            out.add(name, column)
        return out

    def _claim_columns(self, qi: QIDecision, pub_idx: list[int]) -> dict[str, list[Any]]:
        """The k claim's tuples, one column per attribute (None: not grouped)."""
        if not self._claim:
            return {}
        unset = (None,) * len(self._claim)
        chosen = list(map(qi.tuples.get, pub_idx, repeat(unset)))
        if not chosen:
            return {n: [] for n in self._claim}
        by_name = map(list, zip(*chosen, strict=True))
        return dict(zip(self._claim, by_name, strict=True))

    def early(
        self,
        records: Sequence[ValidRecord],
        columns: Columns,
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
        protection = self.protections[name]
        everyone = range(len(records))
        values = attribute_values(columns, len(records), [name])[0]
        stored = view.lookup(rkeys)
        kind, vds = protection.kind, value_digests.get(name)
        if view.sticky and vds is not None and kind is not None:
            hit = [f is not None for f in stored.found(kind, name, vds)]
        else:
            hit = [False] * len(records)
        aside = StateView(states={}, sticky=view.sticky)
        draws = Draws(self.rand, dkeys, stored, aside, self._stores, everyone, value_digests)
        published = protection.apply(values, draws)
        return EarlyColumn(name, published.values, hit, aside.states, published.under)


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
                    stored_map(view.states, key, kind, name).update(values)
            view.touched.add(key)

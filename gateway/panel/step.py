"""The engine's ``panel`` step: the due waves of a window decided whole, each active member
published once per wave, present or imputed, with its class's tuple and analysis weight.

The window holds every record of the waves due (the engine parks a wave's records until it
closes). Per (scope, wave), oldest wave first: a wave after the roster's last one is decided
(:func:`gateway.panel.cohorts.decide_wave`); the last one again (a replay after a crash, or a
late record) republishes its stored outcome, imputed records included, byte for byte; an older
one publishes its records with the quasi-identifiers suppressed.

An imputed member enters the window as a record built from its carried values (sensitive
values, sampling weight, other quasi-identifiers) and a donor's values of the policy's
``other`` attributes (a present respondent of the same wave, drawn by keyed uniform), so it
goes through exactly the protections a present record goes through: its randomized and noised
values are its sticky draws, and nothing in what it publishes, nor in its record id, tells it
from a present record. Record ids are keyed per (respondent, wave); no published record
carries an input position, and none is sent to an input partition's counterpart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

from gateway.engine.columns import PublishedColumns, WindowInputs
from gateway.engine.keyed_inputs import KeyedInputs
from gateway.engine.records import (
    WindowResult,
    attribute_values,
    encode_rows,
    output_rows,
    published_records,
    take_at,
)
from gateway.grouping.claim_partition import ClaimPartition
from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView
from gateway.grouping.mixed_microaggregation import claim_inputs
from gateway.keyed.keyed import Keyring
from gateway.panel.carried import CarryBlock
from gateway.panel.cohorts import PanelRules, Present, WaveOutcome, decide_wave
from gateway.panel.draws import TableView, by_table
from gateway.panel.imputed import Imputed, PanelWindow, columns_of, extended, keep_imputed
from gateway.panel.measures import PanelMeasureSpec, combine_measure, panel_measures
from gateway.panel.output import (
    PSEUDONYM,
    assembled,
    in_release_order,
    panel_record_id,
    panel_record_ids,
    pseudonyms,
    rounded_weights,
    unfollowed_record_id,
    waves_of,
)
from gateway.panel.plan import WindowPlan, batches, input_through, window_report
from gateway.panel.replay import replay_wave
from gateway.panel.roster import KeptRosters, Outcome, Roster, Sealer, roster_entries, roster_key
from gateway.panel.weights import sampling_weights
from gateway.policy import AttrType, Method, Policy, RepublicationMode, Role
from gateway.state_store.state_api import StateStore

log = logging.getLogger(__name__)
CARRY_SALT = b"privgw/v1/panel-carry"


def _aged(policy: Policy, kind: AttrType) -> tuple[str, ...]:
    """The published attributes of ``kind`` outside the k claim an absent member carries: its
    answers, and the ``other`` attributes published beside them (the wave number aside), aged
    by the wave's transitions (:func:`gateway.panel.cohorts.decide_wave`)."""
    return tuple(
        n
        for n, a in policy.attributes.items()
        if a.role in {Role.SENSITIVE, Role.QUASI_IDENTIFIER, Role.OTHER}
        and a.type is kind
        and a.method is not Method.DROP
        and n not in policy.k_claim
        and n != policy.republication.wave_attribute
    )


def panel_step(
    policy: Policy,
    *,
    store: StateStore | None,
    keyring: Keyring | None,
    claim: ClaimPartition | None,
    columns: PublishedColumns,
    inputs: KeyedInputs | None,
) -> PanelStep | None:
    """The engine's panel step: for a ``panel`` policy with a k claim, a state store and a
    secret (without a store, a file is one release and the engine groups it as a whole)."""
    if policy.republication.mode is not RepublicationMode.PANEL or store is None:
        return None
    if keyring is None or inputs is None or claim is None:
        return None
    carry = keyring.hkdf(CARRY_SALT, b"aes-256-gcm")
    return PanelStep(
        policy, store=store, carry_key=carry, claim=claim, columns=columns, inputs=inputs
    )


class PanelStep:
    """Decides the due waves of a window for a ``panel`` policy."""

    def __init__(
        self,
        policy: Policy,
        *,
        store: StateStore,
        carry_key: bytes,
        claim: ClaimPartition,
        columns: PublishedColumns,
        inputs: KeyedInputs,
    ) -> None:
        rep, spec = policy.republication, policy.microaggregation
        assert rep.wave_attribute is not None
        self.policy = policy
        self.wave = rep.wave_attribute
        self._step = rep.wave_step
        self.weight_field = rep.weight_name
        self.rules = PanelRules(
            k=spec.k,
            slack=rep.slack,
            retire_after=rep.retire_after,
            numeric=tuple(claim.numeric),
            aged=_aged(policy, AttrType.CATEGORICAL),
            aged_numbers=_aged(policy, AttrType.NUMERIC),
            aged_times=_aged(policy, AttrType.TIMESTAMP),
        )
        self._store = store
        self._sealer = Sealer(carry_key)
        self._rosters = KeptRosters()
        self._claim = claim
        self._columns = columns
        self._inputs = inputs
        self._names = policy.k_claim
        attrs = policy.attributes
        self._others = [n for n, a in attrs.items() if a.role is Role.OTHER and n != self.wave]
        # the other attributes published are carried (and aged) as the answers are: drawn from
        # any present respondent, a member's own stable value or habitual time told it imputed
        published_other = {*self.rules.aged, *self.rules.aged_numbers, *self.rules.aged_times}
        self._carried = [
            n for n, a in attrs.items() if a.role is not Role.OTHER or n in published_other
        ]
        self._sampling = policy.weight
        self._pseudonym = columns.pseudonym_of
        self._measured = PanelMeasureSpec(
            wave=self.wave,
            claim=policy.k_claim,
            numeric=[c.name for c, num in zip(claim.columns, claim.numeric, strict=True) if num],
            sensitive=[
                n
                for n, a in attrs.items()
                if a.role is Role.SENSITIVE and a.method is not Method.DROP
            ],
            k=spec.k,
            p_pct=policy.risk.interval_pct,
        )

    # -- the window ---------------------------------------------------------------------
    def protect(
        self,
        pw: PanelWindow,
        read_states: Callable[[Sequence[bytes | None]], StateView],
        *,
        encode: bool,
        stray: Callable[[int], bool] | None = None,
    ) -> WindowResult:
        n = len(pw.records)
        cols = [
            claim_inputs(self.policy.attributes[name], column)
            for name, column in zip(
                self._names, attribute_values(pw.columns, n, self._names), strict=True
            )
        ]
        waves = waves_of(pw.columns.get(self.wave, [None] * n))
        plan = WindowPlan()
        rosters: dict[int | None, Roster] = {}
        for (scope, wave), idx in batches(pw, waves, plan):
            roster = rosters.get(scope)
            if roster is None:
                roster = rosters[scope] = self._load(scope)
            last = roster.last_wave
            if stray is not None and stray(wave):
                # a stray wave number (five records of wave 2^31 - 1 closed every later wave
                # early, and the answers after it were lost): decided, it would close them all
                log.warning(
                    "%d records of wave %d, more than republication.max_wave_step (%d) after "
                    "the newest wave read: published with their quasi-identifiers "
                    "suppressed; a panel whose wave numbers skip more sets max_wave_step higher",
                    len(idx), wave, self._step,
                )  # fmt: skip
                self._unplaced(pw, idx, wave, plan)
            elif last is None or wave > last:
                self._decide(roster, scope, wave, idx=idx, pw=pw, cols=cols, plan=plan)
            elif roster.outcome_of(wave) is not None:
                replay_wave(roster, wave, idx, pw, plan, id_of=partial(self._id_at, pw, wave))
            else:  # a late record of a wave decided before the last one
                self._unplaced(pw, idx, wave, plan)
        return self._publish(pw, plan, rosters, waves, read_states, encode=encode)

    def _unplaced(self, pw: PanelWindow, idx: list[int], wave: int, plan: WindowPlan) -> None:
        """Records no wave decision places: published with their quasi-identifiers
        suppressed (their class would hold them alone)."""
        plan.suppressed.extend(idx)
        for i in idx:
            plan.ids[i] = self._id(pw, i, wave)

    def _id_at(self, pw: PanelWindow, wave: int, i: int) -> str:
        return self._id(pw, i, wave)

    def _id(self, pw: PanelWindow, i: int, wave: int | None) -> str:
        key = pw.rkeys[i]
        if key is None or wave is None:
            return unfollowed_record_id(pw.rids[i])
        return panel_record_id(key, wave)

    def forget_partition(self, partition: int) -> None:
        """Drop the rosters (and their draws) kept of a state partition gone to another
        worker."""
        self._rosters.forget(partition)

    def _load(self, scope: int | None) -> Roster:
        return self._rosters.load(self._store.get_many, roster_key(scope), self._sealer)

    # -- deciding a wave ----------------------------------------------------------------
    def _decide(
        self,
        roster: Roster,
        scope: int | None,
        wave: int,
        *,
        idx: list[int],
        pw: PanelWindow,
        cols: list[list[Any]],
        plan: WindowPlan,
    ) -> None:
        lead, repeats = self._leads(idx, pw, cols, wave, plan)
        take = take_at(lead)
        present = Present(
            keys=[pw.rkeys[i] for i in lead],  # type: ignore[misc]
            claim=[take(col) for col in cols] if lead else [() for _ in cols],
            carry=self._carry(pw, lead, roster),
            sampling=self._sampling_weights(pw, lead),
        )
        rand = self._columns.rand

        def uniforms(purpose: str, keys: Sequence[bytes]) -> list[float]:
            drawn: list[float] = rand.uniform(purpose, len(keys), list(keys)).tolist()
            return drawn

        out = decide_wave(
            roster,
            wave,
            present,
            self.rules,
            partition=self._claim.cohorts,
            centroids=self._claim.centroids,
            uniforms=uniforms,
        )
        self._plan_wave(roster, scope, wave, lead=lead, repeats=repeats, pw=pw, out=out, plan=plan)
        roster.outcomes[-1].through = input_through(pw.records, idx)

    def _leads(
        self, idx: list[int], pw: PanelWindow, cols: list[list[Any]], wave: int, plan: WindowPlan
    ) -> tuple[list[int], list[int]]:
        """Each respondent's first record of the wave (its lead), in keyed respondent order,
        and the records that repeat a lead; a record without a respondent or with an incomplete
        claim row is suppressed, as it cannot be followed or grouped. In arrival order, the
        cohorts formed depended on how the input partitions interleaved (two runs of one
        12-wave input grouped two waves' entrants differently), and the stream published other
        tuples than the file workflow on the same rows."""
        keys = [pw.rkeys[i] for i in idx]
        incomplete = {i for col in cols if None in col for i, v in enumerate(col) if v is None}
        if None not in keys and incomplete.isdisjoint(idx) and len(set(keys)) == len(keys):
            known = cast(list[bytes], keys)  # (none is None)
            by_key = sorted(range(len(idx)), key=known.__getitem__)
            return [idx[n] for n in by_key], []  # one record a respondent: every record leads
        first: dict[bytes, int] = {}
        repeats: list[int] = []
        for i, key in zip(idx, keys, strict=True):
            if key is None or i in incomplete:
                plan.suppressed.append(i)
                plan.ids[i] = self._id(pw, i, wave)
            elif key in first:
                repeats.append(i)
            else:
                first[key] = i
        return [first[key] for key in sorted(first)], repeats

    def _plan_wave(
        self,
        roster: Roster,
        scope: int | None,
        wave: int,
        *,
        lead: list[int],
        repeats: list[int],
        pw: PanelWindow,
        out: WaveOutcome,
        plan: WindowPlan,
    ) -> None:
        lead_ids = panel_record_ids(list(take_at(lead)(pw.rkeys)), wave)
        plan.ids.update(zip(lead, lead_ids, strict=True))
        grouped, classes = lead, out.present_class
        if min(classes, default=0) < 0:  # some not grouped: published suppressed
            plan.suppressed.extend(i for i, c in zip(lead, classes, strict=True) if c < 0)
            kept = [n for n, c in enumerate(classes) if c >= 0]
            grouped, classes = [lead[n] for n in kept], [classes[n] for n in kept]
        plan.tuples.update(zip(grouped, map(out.tuples.__getitem__, classes), strict=True))
        plan.weights.update(zip(grouped, map(out.weights.__getitem__, classes), strict=True))
        # a member's repeated records of the wave (a resubmission, a producer's retry) are
        # decided, not published: its first record stands for them, so the release holds each
        # member once, under one id a consumer can keep, and a weighted total counts it once
        plan.dropped.update(repeats)
        out.measures["panel_repeats"] = float(len(repeats))
        imputed_ids = panel_record_ids([roster.keys[row] for row in out.imputed_rows], wave)
        for row, cls, rid in zip(out.imputed_rows, out.imputed_class, imputed_ids, strict=True):
            carried = roster.carried.values_of(row)  # before a later wave of the window
            plan.imputed.append(
                Imputed(scope, wave, row, out.tuples[cls], out.weights[cls], rid, carried)
            )
        roster.decided(Outcome(wave, out.class_of_row, out.tuples, out.weights))
        plan.classes.extend(out.sizes)
        for name, value in out.measures.items():
            plan.measures[name] = combine_measure(name, plan.measures.get(name), value)

    def _carry(self, pw: PanelWindow, rows: list[int], roster: Roster) -> CarryBlock:
        """What each respondent at ``rows`` is carried forward with (``Roster.carried``)."""
        names = [n for n in self._carried if n in pw.columns]
        take = take_at(rows)  # gathered column by column (itemgetter: in C)
        cols: list[Sequence[Any]] = [take(pw.columns[n]) for n in names] if rows else []
        if (pseudonym := self._pseudonym) is not None:
            names.append(PSEUDONYM)
            ids = [pw.records[i].respondent_id for i in rows]
            cols.append(tuple(None if rid is None else pseudonym(rid) for rid in ids))
        if not rows:
            cols = [() for _ in names]
        return CarryBlock(roster.carried.names_id(names), cols)

    def _sampling_weights(self, pw: PanelWindow, rows: list[int]) -> list[float]:
        col = pw.columns.get(self._sampling) if self._sampling is not None else None
        if col is None:
            return [1.0] * len(rows)
        return sampling_weights(take_at(rows)(col))

    # -- replaying the last wave --------------------------------------------------------
    # -- publishing ---------------------------------------------------------------------
    def _publish(
        self,
        pw: PanelWindow,
        plan: WindowPlan,
        rosters: dict[int | None, Roster],
        waves: list[int | None],
        read_states: Callable[[Sequence[bytes | None]], StateView],
        *,
        encode: bool,
    ) -> WindowResult:
        records, rkeys, dkeys, values = extended(
            pw,
            plan.imputed,
            rosters,
            waves,
            rand=self._columns.rand,
            inputs=self._inputs,
            others=self._others,
            wave_name=self.wave,
        )
        n_in = len(pw.records)
        rids = [*pw.rids, *(entry[5] for entry in plan.imputed)]
        columns = {name: list(col) for name, col in pw.columns.items()}
        synth_cols = columns_of(records[n_in:], list(columns))
        for name, col in synth_cols.items():
            columns.setdefault(name, [None] * n_in).extend(col)
        view = self._draw_view(pw, plan, rosters, rkeys, read_states)
        qi = QIDecision()
        qi.tuples.update(plan.tuples)
        qi.tuples.update((n_in + j, entry[3]) for j, entry in enumerate(plan.imputed))
        qi.suppressed = sorted(set(plan.suppressed))
        pub_idx = [i for i in range(len(records)) if i not in plan.dropped]
        win = WindowInputs(records, rids, columns, rkeys, dkeys, view)
        out = self._columns.output(win, qi, pub_idx, early=None, value_digests=values)
        ids = {**plan.ids, **{n_in + j: e[5] for j, e in enumerate(plan.imputed)}}
        out.columns[0] = [ids[i] for i in pub_idx]
        weights = {**plan.weights, **{n_in + j: e[4] for j, e in enumerate(plan.imputed)}}
        out.add(self.weight_field, rounded_weights(list(map(weights.get, pub_idx))))
        pseudonyms(out, records, pub_idx, n_in)
        pub_idx = in_release_order(out, pub_idx, ids, [*waves, *(e[1] for e in plan.imputed)])
        keep_imputed(
            plan.imputed, rosters, names=out.names, cols=out.columns, pub_idx=pub_idx, n_in=n_in
        )
        suppressed = set(qi.suppressed)
        plan.measures.update(  # before assembled() appends the re-sent records to the columns
            panel_measures(
                self._measured, out.names, out.columns, pub_idx, columns,
                n_in=n_in, suppressed=suppressed, release_sizes=plan.release_sizes,
            )
        )  # fmt: skip
        names, cols, pub_rids, flags, respondents, keys = assembled(
            out,
            pub_idx,
            respondents=[rkeys[i] for i in pub_idx],
            suppressed=suppressed,
            replayed=plan.replayed,
            wave_name=self.wave,
        )
        self._write(rosters)
        rows = output_rows(names, cols) if encode else []
        values_out = encode_rows(names, cols) if encode else [b""] * len(pub_rids)
        published = published_records(
            pub_rids, keys, values_out, [None] * len(pub_rids), flags, respondents=respondents
        )
        return WindowResult(
            published=published,
            held=[],
            report=window_report(
                pw, plan, out, published=len(published), suppressed=len(suppressed)
            ),
            rows=rows,
            output=None if encode else (names, cols),
        )

    def _draw_view(
        self,
        pw: PanelWindow,
        plan: WindowPlan,
        rosters: dict[int | None, Roster],
        rkeys: list[bytes | None],
        read_states: Callable[[Sequence[bytes | None]], StateView],
    ) -> TableView:
        """The window's draws: its scopes' draw tables (rosters loaded for scopes that decide
        nothing here, such as a record without a wave), after taking in the draws that
        respondents the tables do not know hold in states of their own (read once)."""
        scope_of: dict[bytes, int | None] | None = None
        if pw.scopes is None:
            if None not in rosters and any(key is not None for key in rkeys):
                rosters[None] = self._load(None)
        else:
            scope_of = {}
            for key, scope in zip(pw.rkeys, pw.scopes, strict=True):
                if key is not None:
                    scope_of[key] = scope
            for entry in plan.imputed:
                scope_of[rosters[entry[0]].keys[entry[2]]] = entry[0]
            for missing in set(scope_of.values()) - set(rosters):
                rosters[missing] = self._load(missing)
        tables = {scope: roster.draws for scope, roster in rosters.items()}
        unknown = [
            (table, table.unknown([rkeys[i] for i in at]))
            for table, at in by_table(tables, scope_of, rkeys)
        ]
        wanted = [key for _, keys in unknown for key in keys]
        if wanted:
            states = read_states(wanted).states
            for table, keys in unknown:
                table.absorb(keys, states)
        return TableView(states={}, sticky=True, tables=tables, scope_of=scope_of)

    def _write(self, rosters: dict[int | None, Roster]) -> None:
        """The rosters, with their members' draws, in one durable batch."""
        entries: dict[bytes, bytes] = {}
        keyed = {roster_key(scope): roster for scope, roster in rosters.items()}
        for key, roster in keyed.items():
            entries.update(roster_entries(roster, self._sealer, key))
        if entries:
            self._store.put_many(entries)
        self._rosters.written(entries, keyed)

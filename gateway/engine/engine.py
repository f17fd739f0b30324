"""Window protection: the one entry point the stream worker and the file workflow share.

``Engine.protect_window`` takes a batch of validated records (new ones plus those held from
earlier windows) and returns the protected records, the records still held, and a report.
With a keyring and a state store it is *sticky* (DESIGN.md §5): a respondent's published
values are drawn once per (respondent, attribute, true value) from keyed randomness, stored as
digests + published values, and republished unchanged; quasi-identifiers that did not change
keep their stored centroid, and only new or changed ones are microaggregated, among
themselves, once at least k of them are waiting.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.engine.claim_step import ClaimStep, ClaimWindow
from gateway.engine.columns import Output, PublishedColumns, WindowInputs
from gateway.engine.keyed_inputs import (
    DIGEST_CACHE_LIMIT,
    KeyedInputs,
    WindowKeys,
    keys_at,
    strata_of,
)
from gateway.engine.records import (
    NO_MARKS,
    Columns,
    InputMarks,
    ValidRecord,
    WindowReport,
    WindowResult,
    attribute_values,
    encode_published,
    leading_run,
    output_rows,
    published_records,
    record_ids,
    record_ids_at,
    values_at,
    window_columns,
    window_digest,
    window_id_from,
)
from gateway.engine.release_metadata import release_metadata
from gateway.engine.routing import StatePartitions, state_partitions
from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView
from gateway.grouping.replay import Committed
from gateway.grouping.scope import GroupingInputs, refuse_engine
from gateway.keyed.draw_derivation import DrawDerivation, DrawPin
from gateway.keyed.keyed import KeyedSource, Keyring
from gateway.keyed.randomness import SeededSource, UniformSource
from gateway.measures.attack import unique_combinations
from gateway.measures.window_keys import key_measures
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.registry import protections, randomized
from gateway.panel.imputed import PanelWindow
from gateway.panel.step import panel_step
from gateway.policy import (
    ConsistencyMode,
    Method,
    Policy,
    Pseudonym,
    Role,
)
from gateway.state_store.state_api import StateStore
from gateway.state_store.state_codec import decode_state, registry_counts
from gateway.state_store.state_keys import group_id, group_key, scoped_key
from gateway.state_store.window_state import write_states


def _draw_source(keyring: Keyring | None, pin: DrawPin) -> UniformSource:
    """Keyed draws for a sticky engine with a secret, else seeded ones (files)."""
    return SeededSource() if keyring is None else KeyedSource(keyring, pin.derivation)


class Engine:
    """Protects windows of records according to a policy.

    Without a keyring the engine is stateless and draws from ``randomness`` (seeded runs on
    files). With a keyring it draws from keyed randomness; with a store it is also sticky.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        keyring: Keyring | None = None,
        store: StateStore | None = None,
        randomness: UniformSource | None = None,
        consistency_override: bool = False,
        frequencies: Mapping[str, Mapping[str, float]] | None = None,
        partition_scope: bool = False,
        measure_risk: bool = True,
        draws: DrawDerivation | None = None,
    ) -> None:
        """``draws``: how keyed draws derive from the secret (:mod:`gateway.keyed.draw_derivation`);
        None: the one the store records, else the default for new deployments. A deployment
        settles it before the first window (:meth:`use_draws`).

        ``partition_scope``: the state follows input partitions (scale-out with state that
        moves with its partition): every state key names its record's partition
        (:func:`gateway.state_store.state_keys.state_key_partition`) and microaggregation groups are
        formed within one partition, so a group's members and its registry entry always move
        together.

        ``measure_risk=False``: a risk-sampled window returns its microaggregated records
        (``WindowResult.aggregated``) without measuring them — a shard of a window
        (:mod:`gateway.engine.shards`), measured once the shards' results are merged."""
        refuse_engine(policy, keyring is not None, store is not None, consistency_override)
        self.policy = policy
        self.version = policy.version
        self._keyring = keyring
        self._partition_scope = partition_scope
        # with partition_scope: each record's state partition, from its respondent's key (set
        # by the wiring once it knows the partition count); unset, the record's own partition
        self.state_partitions: StatePartitions | None = None
        self._parts: list[int] = []  # the window's state partitions (partition_scope)
        self._inputs = KeyedInputs(policy, keyring) if keyring is not None else None
        self._consistent = policy.consistency.mode is ConsistencyMode.STICKY
        self._store = store if self._consistent else None
        self._pin = DrawPin(self._store, draws)
        rand = randomness or _draw_source(keyring if self._consistent else None, self._pin)
        # every published attribute's protection outside the k claim, built once
        protects = protections(policy, frequencies)
        self.mechanisms: dict[str, RRMechanism] = randomized(protects)
        # the k claim: every quasi-identifier microaggregated together (Domingo-Ferrer & Torra)
        self._qi_agg = policy.k_claim
        self._claims = ClaimStep(
            policy, inputs=self._inputs, store=self._store, measure_risk=measure_risk
        )
        self._ldiv = self._claims.ldiv
        self._sensitive_published = [
            n
            for n, a in policy.attributes.items()
            if a.role is Role.SENSITIVE and a.method is not Method.DROP
        ]
        self._windows = 0
        # groups never cross a stratum
        self._strata = list(policy.microaggregation.strata or []) if self._qi_agg else []
        self._columns = PublishedColumns(
            policy,
            protections=protects,
            rand=rand,
            stores=self._store is not None,
            ldiv=self._ldiv,
            pseudonym=keyring.pseudonym
            if policy.output.pseudonym is Pseudonym.HMAC and keyring is not None
            else None,
        )
        # republication: panel (gateway/panel): due waves decided whole, every member published
        self._panel = panel_step(
            policy,
            store=self._store,
            keyring=keyring,
            claim=self._claims.claim if self._qi_agg and self._inputs is not None else None,
            columns=self._columns,
            inputs=self._inputs,
        )
        # group id -> formation size: never changes, so kept across windows (each window's view
        # writes into it); a window of republished records reads no registry entry again
        self._group_sizes: dict[str, int] = {}

    # ------------------------------------------------------------------ keyed draws
    @property
    def draws(self) -> DrawDerivation | None:
        """The derivation of the keyed draws (None: the draws are not keyed)."""
        rand = self._columns.rand
        return rand.derivation if isinstance(rand, KeyedSource) else None

    def draws_bound(self) -> DrawDerivation | None:
        """The derivation the state's entries were drawn with (None: a fresh state)."""
        return self._pin.bound if self.draws is not None else None

    def use_draws(self, derivation: DrawDerivation) -> None:
        """Draw with ``derivation`` (the deployment's,
        :func:`~gateway.keyed.draw_derivation.settle`): refused when the state is bound to another
        one."""
        if self.draws is None or derivation is self.draws:
            return
        self._pin.use(derivation)
        assert self._keyring is not None
        self._columns.rand = KeyedSource(self._keyring, derivation)

    def forget_partition(self, partition: int) -> None:
        """A state partition went to another worker: drop what is kept of it between windows."""
        if self._panel is not None:
            self._panel.forget_partition(partition)

    # ------------------------------------------------------------------ metadata
    def metadata(self, described: Policy | None = None) -> dict[str, object]:
        """Everything an analyst needs to reconstruct statistics (the meta topic's value).
        ``described``: the policy a file was protected under when this engine ran only part of
        it (``privgw protect`` groups the keys of recoding, strata and l-diversity itself and
        has the engine publish the rest): its version, claim and methods are published."""
        return release_metadata(
            self.policy if described is None else described,
            protections=self._columns.protections,
            draws=self.draws,
        )

    # ------------------------------------------------------------------ the window
    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        by_attribute: Mapping[str, Sequence[Any]] | None = None,
        encode: bool = True,
        keys: WindowKeys | None = None,
        marks: InputMarks = NO_MARKS,
    ) -> WindowResult:
        """Protect a window. ``by_attribute``: the records' values by attribute, aligned with
        ``records``, from a caller that holds the window as columns (the engine process); they
        are read instead of each record's ``values``, which must then agree with them. Without
        them they are built once here, for the records decided (a held wave's records are not
        read): past this point the engine reads values only by column.
        ``encode=False``: the published values come back as columns (``WindowResult.output``)
        for the caller to encode with :func:`encode_rows` (the engine process hands that work
        to the worker, whose core has time to spare).
        ``keys``: the records' :class:`WindowKeys`, from a :class:`KeyedInputs` of the same
        policy and secret (computed here when not given).
        ``marks``: the offsets committed and the waves closed (:class:`InputMarks`)."""
        if keys is not None and len(keys.respondents) != len(records):
            raise ValueError(
                f"keys for {len(keys.respondents)} records given with a window of "
                f"{len(records)}: they must be the window's own (KeyedInputs.of)"
            )
        committed = marks.committed
        if committed is not None:  # every partition the caller reads: the release clock
            self._claims.releases.own(committed, now)  # waits for those not heard from yet
        if marks.closed_through is not None:
            self._claims.releases.close_through(marks.closed_through)
        wave = self.policy.republication.wave_attribute
        waves = values_at(records, by_attribute, wave)  # parking reads only a few of them
        parked = self._claims.parked(
            records, waves, now=now, flush_all=flush_all, wall=marks.wall_time
        )
        if not parked:
            columns = window_columns(records) if by_attribute is None else by_attribute
            return self._protect_window(
                records,
                record_ids(records),
                now=now,
                flush_all=flush_all,
                columns=columns,
                encode=encode,
                keys=keys,
                committed=committed,
            )
        # records waiting for their wave to close are handed back held, undecided
        lead = leading_run(parked)  # those parked last time come first
        aside = set(parked[lead:])
        active = [i for i in range(lead, len(records)) if i not in aside]
        active_ids = record_ids_at(records, active)
        deciding = [records[i] for i in active]
        res = self._protect_window(
            deciding,
            active_ids,
            now=now,
            flush_all=flush_all,
            columns=window_columns(deciding)
            if by_attribute is None
            else {n: [c[i] for i in active] for n, c in by_attribute.items()},
            encode=encode,
            keys=None if keys is None else keys_at(keys, active),
            committed=committed,
        )
        report = replace(
            res.report,
            window_id=window_id_from(
                records, [(parked, self._claims.parked_ids()), (active, active_ids)]
            ),
            records_in=len(records),
            held=res.report.held + len(parked),
        )
        # the parked run in front is sliced, not looked up one by one (most of an open wave)
        held = [*records[:lead], *(records[i] for i in parked[lead:]), *res.held]
        return replace(res, held=held, report=report)

    def _protect_window(
        self,
        records: Sequence[ValidRecord],
        rids: list[str],
        *,
        now: float,
        flush_all: bool,
        columns: Columns,
        encode: bool,
        keys: WindowKeys | None,
        committed: Committed | None,
    ) -> WindowResult:
        """The window's steps: keys, state read, grouping, mechanisms, state write, report."""
        self._windows += 1
        if self.draws is not None:
            self._pin.record_once()  # the state is bound to the derivation from now on
        sticky = self._consistent and self._keyring is not None
        if self._panel is not None:
            return self._panel_window(records, rids, columns, keys, encode=encode)
        # the k-claim digests given with the keys; else taken from the claim inputs the
        # quasi-identifier step computes anyway (None)
        given_qi = keys.quasi_identifiers if keys is not None and sticky else None
        rkeys, dkeys, keys = self._keys(records, rids, columns, keys)
        view = self._read_states(rkeys, sticky)
        win = WindowInputs(records, rids, columns, rkeys, dkeys, view)
        # -- quasi-identifiers: sticky centroids, new groups, holds -----------------------
        value_digests = keys.values if keys is not None and sticky else {}
        # within strata; l-diverse on the published values of one attribute, taken first
        strata = strata_of(self._strata, columns, len(records))
        early = self._columns.early(
            records, columns, rkeys=rkeys, dkeys=dkeys, view=view, value_digests=value_digests
        )
        grouping = GroupingInputs(
            strata,
            None
            if strata is None or self._inputs is None
            else self._inputs.stratum_digests(strata),
            None if early is None else early.out,
        )
        republish = self._claims.republishes(sticky)
        claim_window = ClaimWindow(
            records,
            rids,
            rkeys,
            columns,
            view,
            grouping,
            given_qi,
            scopes=self._parts if self._partition_scope else None,
            sampled=(self._windows - 1) % self.policy.risk.sample_every == 0,
        )
        qi, regroups = self._claims.decide(claim_window, now=now, flush_all=flush_all)
        held = set(qi.held)
        pub_idx = [i for i in range(len(records)) if i not in held]
        out = self._columns.output(win, qi, pub_idx, early=early, value_digests=value_digests)
        # -- state first (durable), then the caller produces the outputs ----------------
        if self._store is not None:
            write_states(
                self._store,
                view,
                qi,
                regroups,
                published=pub_idx,
                rkeys=rkeys,
                rids=rids,
                waves=attribute_values(columns, len(records), ["wave"])[0],
                republish=republish,
                stratum_digests=grouping.stratum_digests,
                committed=committed,
            )
        return self._result(win, qi, pub_idx, out, encode=encode)

    def _panel_window(
        self,
        records: Sequence[ValidRecord],
        rids: list[str],
        columns: Columns,
        keys: WindowKeys | None,
        *,
        encode: bool,
    ) -> WindowResult:
        """A ``panel`` policy's due waves (:mod:`gateway.panel.step`)."""
        assert self._panel is not None
        rkeys, dkeys, keys = self._keys(records, rids, columns, keys)
        assert keys is not None
        window = PanelWindow(
            records,
            rids,
            columns,  # read only (the panel step copies what it extends)
            rkeys,
            list(dkeys),
            keys,
            self._parts if self._partition_scope else None,
        )
        read = functools.partial(self._read_states, sticky=True)
        # a wave the release clock holds a stray (beyond max_wave_step): never decided
        return self._panel.protect(window, read, encode=encode, stray=self._claims.releases.beyond)

    def _keys(
        self,
        records: Sequence[ValidRecord],
        rids: list[str],
        columns: Columns,
        keys: WindowKeys | None,
    ) -> tuple[list[bytes | None], Sequence[bytes | None], WindowKeys | None]:
        """The window's respondent keys (state: scoped to the state partition with partitioned
        state), what keyed draws are bound to (the respondent, or the record itself when it
        carries no respondent id), and the window's keys (computed unless given)."""
        if self._partition_scope:
            self._parts = state_partitions(records, self.state_partitions)
        if self._inputs is None:
            none: list[bytes | None] = [None] * len(records)
            return none, none, keys
        if keys is None:
            keys = self._inputs.of(records, rids=rids, by_attribute=columns, claim=False)
        rkeys = list(keys.respondents)
        if self._partition_scope:  # draws stay bound to the respondent alone
            for i, r in enumerate(records):
                if r.respondent_id is not None:
                    rkeys[i] = scoped_key(self._parts[i], rkeys[i] or b"")
        return rkeys, keys.draws, keys

    def _read_states(self, rkeys: Sequence[bytes | None], sticky: bool) -> StateView:
        """The window's respondents' states, its view of live counts."""
        wanted = sorted({key for key in rkeys if key is not None})
        found = self._store.get_many(wanted) if self._store is not None else {}
        states = {key: decode_state(raw) for key, raw in found.items()}
        if len(self._group_sizes) > DIGEST_CACHE_LIMIT:
            self._group_sizes.clear()
        return StateView(
            states=states,
            sticky=sticky,
            sizes=self._group_sizes,
            load_live=self._load_live if self._store is not None else None,
        )

    def _measures(
        self, win: WindowInputs, qi: QIDecision, pub_idx: list[int], out: Output
    ) -> dict[str, float]:
        """A risk-sampled window's measures: the grouping's, risk over the whole key, and the
        published sensitive values' uniques (sticky values that could link releases)."""
        measures = dict(qi.measures)
        release_ldiv = measures.pop("release_ldiv_min", None)
        if not (qi.sampled and (self._qi_agg or self._sensitive_published)):
            return measures
        out_by_name = dict(zip(out.names, out.columns, strict=True))
        if self._qi_agg:
            measures.update(
                key_measures(
                    out_by_name,
                    pub_idx,
                    qi,
                    win.view,
                    set(qi.suppressed),
                    k=self.policy.microaggregation.k,
                    claim=self._qi_agg,
                    sensitive=self._sensitive_published,
                )
            )
        if release_ldiv is not None and self._ldiv is not None:
            # every class published here, counted over its release so far
            name = f"ldiv_min:{self._ldiv}"
            measures[name] = min(measures.get(name, release_ldiv), release_ldiv)
        if self._sensitive_published:
            sensitive = [out_by_name[n] for n in self._sensitive_published]
            measures["sensitive_records"] = float(len(pub_idx))
            measures["sensitive_uniques"] = float(unique_combinations(sensitive))
        return measures

    def _result(
        self, win: WindowInputs, qi: QIDecision, pub_idx: list[int], out: Output, *, encode: bool
    ) -> WindowResult:
        """The protected records, those held, and the window's report."""
        records, suppressed = win.records, set(qi.suppressed)
        rows = output_rows(out.names, out.columns) if encode else []
        published = published_records(
            out.columns[0],  # record ids
            out.keys,
            encode_published(rows) if encode else [b""] * len(pub_idx),
            [records[i].source for i in pub_idx],
            [i in suppressed for i in pub_idx],
            respondents=[None] * len(pub_idx),
        )
        sizes = [size for _, size in qi.groups]
        report = WindowReport(
            window_id=window_digest(
                rid if r.source else str(i)
                for i, (rid, r) in enumerate(zip(win.rids, records, strict=True))
            ),
            records_in=len(records),
            published=len(published),
            held=len(qi.held),
            suppressed=len(qi.suppressed),
            min_group_size=min(sizes) if sizes else None,
            groups=len(qi.groups),
            sticky_hits=out.hits,
            deferred_moves=qi.deferred,
            risk_sampled=qi.sampled,
            measures=self._measures(win, qi, pub_idx, out),
            retention=out.retention,
            randomized=out.randomized,
            noise_sd=out.noise_sd,
        )
        return WindowResult(
            published=published,
            held=[records[i] for i in qi.held],
            report=report,
            rows=rows,
            aggregated=qi.aggregated,
            output=None if encode else (out.names, out.columns),
        )

    def _load_live(self, group_ids: Sequence[str]) -> dict[str, tuple[int, int | None]]:
        assert self._store is not None
        found = self._store.get_many([group_key(g) for g in group_ids])
        return {group_id(key): registry_counts(raw) for key, raw in found.items()}

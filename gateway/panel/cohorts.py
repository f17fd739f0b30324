"""One wave of a panel, decided whole: cohorts, imputation, tuples, weights, linked sets.

* **Cohorts.** Whole-key MDAV groups formed among new respondents are cohorts for good: never
  split, only merged whole. A wave's new entrants form cohorts among themselves when there are
  at least k of them; fewer join their nearest cohort (a joiner's candidate set is its cohort;
  the others' sets, which never held it, are unchanged).
* **Every active member in every release.** A member absent from the wave is published in it,
  its values aged by the moves of those present in both waves (:mod:`gateway.panel.ageing`)
  and randomized with its sticky draws: every chain of records is in every release.
* **Retirement.** A member absent ``retire_after`` waves in a row stops being published, but
  only when every other member's linked candidate set stays >= k without it: the survivors'
  sets are intersections over the history, and no later merge could grow them back.
* **What a cohort publishes.** The mean of its members' current and imputed numbers, one
  combination of their categories that the edit rules allow (the claim's centroids), and a
  weight raked so that every category's weighted share is its share among the release's current
  and imputed values (:mod:`gateway.panel.weights`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.engine.records import take_at
from gateway.panel.ageing import Uniforms, WaveMoves, age_absent, observe_moves, wave_moves
from gateway.panel.carried import CarryBlock, objects
from gateway.panel.centres import cohort_centres, nearest
from gateway.panel.roster import Roster
from gateway.panel.weights import RakingSpec, kish_deff, rake
from gateway.policy import MISSING_LABEL

Partition = Callable[[list[list[object]], int], NDArray[np.int64]]  # rows, k -> cohort labels
Centroids = Callable[[list[list[object]], NDArray[np.int64]], list[list[Any]]]


@dataclass(frozen=True, slots=True)
class PanelRules:
    k: int
    slack: int
    retire_after: int
    numeric: tuple[bool, ...]
    raking: RakingSpec = field(default_factory=RakingSpec)
    # carried categorical attributes outside the claim (randomized answers), each aged by its
    # own wave-to-wave transitions: carried forward, an absent member's answer would pull the
    # wave's estimate toward the previous wave by (absent share) x (change rate)
    aged: tuple[str, ...] = ()
    # carried numbers outside the claim (noised answers), aged likewise: a donor's change
    aged_numbers: tuple[str, ...] = ()
    aged_times: tuple[str, ...] = ()  # carried timestamps: a donor's shift

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError(f"k must be >= 2, got {self.k}")
        if self.retire_after < 1:
            raise ValueError(f"retire_after must be >= 1, got {self.retire_after}")


@dataclass(frozen=True, slots=True)
class Present:
    """A wave's respondents that answered (their first record), with complete claim rows."""

    keys: Sequence[bytes]
    claim: Sequence[Sequence[object]]  # the claim rows as columns, one an attribute
    carry: CarryBlock  # what an absent member is carried forward with (Roster.carried)
    sampling: Sequence[float]  # sampling weights (1.0 without one)

    def row(self, i: int) -> list[object]:
        """The claim row of the respondent at ``i``."""
        return [col[i] for col in self.claim]

    def claim_columns(self, at: Sequence[int]) -> list[Sequence[object]]:
        """The claim at ``at``, one sequence an attribute (gathered in C)."""
        if not at:
            return [() for _ in self.claim]
        take = take_at(at)
        return [take(col) for col in self.claim]

    def carry_at(self, at: Sequence[int]) -> CarryBlock:
        """What the respondents at ``at`` carry."""
        if not at:
            return CarryBlock(self.carry.names_id, [() for _ in self.carry.columns])
        take = take_at(at)
        return CarryBlock(self.carry.names_id, [take(col) for col in self.carry.columns])


@dataclass(slots=True)
class WaveOutcome:
    """Per present respondent (in :class:`Present` order) and per imputed roster row: the
    class it publishes (-1: not grouped, published with its quasi-identifiers suppressed)."""

    present_class: list[int]
    imputed_rows: list[int]
    imputed_class: list[int]
    tuples: list[list[Any]]
    weights: list[float]
    class_of_row: NDArray[np.int32]
    sizes: list[int] = field(default_factory=list)  # records in each class
    measures: dict[str, float] = field(default_factory=dict)


def decide_wave(
    roster: Roster,
    wave: int,
    present: Present,
    rules: PanelRules,
    *,
    partition: Partition,
    centroids: Centroids,
    uniforms: Uniforms,
) -> WaveOutcome:
    """Decide ``wave`` and update ``roster`` in place."""
    numeric = rules.numeric
    rows_of = roster.rows_of(list(present.keys))
    observed = wave_moves(rules.aged, rules.aged_numbers, rules.aged_times)
    transitions = observed[0]
    returned, absent = _returning(roster, wave, present, rows_of, observed, numeric)
    age_absent(
        roster,
        absent,
        observed,
        nominal=_categorical(numeric),
        uniforms=uniforms,
        wave=wave,
    )
    for r in absent:
        roster.streak[r] += 1
    members = roster.members()
    retired = _retire(roster, absent, rules, members)
    if retired:
        members = roster.members()
    new_idx = [i for i, row in enumerate(rows_of) if row is None]
    joined = _enter(
        roster,
        wave,
        present,
        new_idx=new_idx,
        rows_of=rows_of,
        members=members,
        rules=rules,
        partition=partition,
    )
    if new_idx:
        members = roster.members()
    if _merge_small(roster, members, rules):
        members = roster.members()
    out = _publish(roster, members, rules, centroids)
    class_of = out.class_of_row.tolist()
    imputed_rows = [r for r in absent if roster.active[r]]
    outcome = WaveOutcome(
        present_class=(
            [-1 if r is None else class_of[r] for r in rows_of]
            if None in rows_of
            else list(map(class_of.__getitem__, rows_of))
        ),
        imputed_rows=imputed_rows,
        imputed_class=[class_of[r] for r in imputed_rows],
        tuples=out.tuples,
        weights=out.weights,
        class_of_row=out.class_of_row,
        sizes=out.sizes.tolist(),
    )
    m = outcome.measures
    m.update(out.measures)
    m["panel_present"] = float(len(rows_of) - rows_of.count(None))
    m["panel_imputed"] = float(len(outcome.imputed_rows))
    m["panel_retired"] = float(retired)
    m["panel_returned"] = float(returned)
    m["panel_joined"] = float(joined)
    m["panel_transition_pairs"] = float(transitions.pairs)
    m["panel_stale_ratio"] = _stale(roster, rows_of, out, numeric)
    return outcome


def _returning(  # noqa: PLR0917 - the wave's parts
    roster: Roster,
    wave: int,
    present: Present,
    rows_of: list[int | None],
    observed: WaveMoves,
    numeric: Sequence[bool],
) -> tuple[int, list[int]]:
    """The members present: their moves observed (the claim's categories as a tuple, and each
    aged answer on its own), then their rows overwritten, a column at a time; how many came back
    from retirement, and the active members absent."""
    carried = roster.carried
    transitions, answers, joint = observed
    back = [i for i, row in enumerate(rows_of) if row is not None]
    at = np.asarray([rows_of[i] for i in back], dtype=np.intp)
    seen = np.asarray(roster.seen, dtype=np.int64)
    active = np.asarray(roster.active, dtype=np.bool_)
    # moves from the wave decided before (not wave - 1: a panel may skip a number, and then
    # no move was observed and every absent member was carried forward, not aged)
    previous = wave - 1 if roster.last_wave is None else roster.last_wave
    moved = np.flatnonzero((seen[at] == previous) & (carried.observed[at] == previous))
    cat = _categorical(numeric)
    before = carried.combos(at[moved], cat)
    after = present.claim_columns([back[i] for i in moved.tolist()])
    transitions.observe_many(
        before, list(zip(*[after[j] for j in cat], strict=True)) if cat else [()] * len(before)
    )
    if answers:
        now = present.carry_at([back[i] for i in moved.tolist()])
        observe_moves(carried, at[moved], now, answers, joint)
    returned = int(np.count_nonzero(~active[at]))
    if at.size:
        active[at] = True
        seen[at] = wave
        streak = np.asarray(roster.streak, dtype=np.int64)
        streak[at] = 0
        roster.active, roster.seen, roster.streak = active.tolist(), seen.tolist(), streak.tolist()
        carried.assign(
            at,
            present.claim_columns(back),
            present.carry_at(back),
            [present.sampling[i] for i in back],
            wave,
        )
    transitions.freeze()
    for aged in (*answers.values(), *([joint] if joint is not None else [])):
        aged.freeze()
    active[at] = False  # (a local copy: the roster's is written) the absent, active members
    return returned, np.flatnonzero(active).tolist()


def _categorical(numeric: Sequence[bool]) -> list[int]:
    """The claim's nominal positions."""
    return [j for j, is_num in enumerate(numeric) if not is_num]


def _retire(
    roster: Roster, absent: list[int], rules: PanelRules, members: dict[int, list[int]]
) -> int:
    """Retire the long-absent members whose going leaves every other member's linked set
    >= k (each retirement is checked against those already made); ``members``: the active
    rows by cohort before."""
    retired = 0
    active = {c: set(rows) for c, rows in members.items()}
    for r in absent:
        if roster.streak[r] < rules.retire_after:
            continue
        staying = active[roster.cohort[r]] - {r}
        # each member's set as it will be: what it held, among those still published
        if all(len(roster.linked[j] & staying) >= rules.k for j in staying):
            roster.active[r] = False
            active[roster.cohort[r]] = staying
            retired += 1
    return retired


def _enter(
    roster: Roster,
    wave: int,
    present: Present,
    *,
    new_idx: list[int],
    rows_of: list[int | None],
    members: dict[int, list[int]],
    rules: PanelRules,
    partition: Partition,
) -> int:
    """New respondents: cohorts of their own once >= k, else each joins its nearest cohort.
    Returns how many joined an existing cohort."""
    if not new_idx:
        return 0
    k = rules.k
    if len(new_idx) >= k:
        claim = present.claim_columns(new_idx)
        size = k + rules.slack if len(new_idx) >= k + rules.slack else len(new_idx)
        labels = partition([list(col) for col in claim[: len(rules.numeric)]], size)
        base = roster.next_cohort
        added = roster.add_many(
            [present.keys[i] for i in new_idx],
            (labels + base).tolist(),
            wave=wave,
            claim=claim,
            carry=present.carry_at(new_idx),
            sampling=[present.sampling[i] for i in new_idx],
        )
        for i, row in zip(new_idx, added, strict=True):
            rows_of[i] = row
        roster.next_cohort = base + int(labels.max()) + 1
        return 0
    if not members:  # fewer than k respondents in all: nothing to hide them in
        return 0
    cohorts = sorted(members)
    centres = cohort_centres(roster, cohorts, members, rules.numeric)
    for i in new_idx:
        claim_row = present.row(i)
        c = cohorts[nearest(claim_row, centres, rules.numeric)]
        rows_of[i] = roster.add(
            present.keys[i],
            c,
            wave=wave,
            claim=claim_row,
            carry=present.carry_at([i]),
            sampling=present.sampling[i],
        )
    return len(new_idx)


def _merge_small(roster: Roster, members: dict[int, list[int]], rules: PanelRules) -> bool:
    """Cohorts below k active members (a policy whose k rose) merge whole: each with the
    nearest other small one while any is left, else with the nearest cohort; centres computed
    once. Merged one at a time into the nearest of all, cohorts of 5 under a new k of 6 made
    cohorts of 10-30 (17 % more information loss than k 6 from the start, for good), and the
    centres recomputed per merge took 20 s for 1,000 cohorts. Whether any merged."""
    k = rules.k
    small = sorted(c for c, rows in members.items() if len(rows) < k)
    if not small or len(members) < 2:
        return False
    ids = sorted(members)
    at = {c: i for i, c in enumerate(ids)}
    centres = cohort_centres(roster, ids, members, rules.numeric)
    size = np.asarray([len(members[c]) for c in ids], dtype=np.int64)
    alive = np.ones(len(ids), dtype=np.bool_)
    into: dict[int, int] = {}
    for c in small:
        i = at[c]
        if size[i] >= k:  # grew to k by taking in small ones
            continue
        alive[i] = False
        among = alive & (size < k)
        if not among.any():
            among = alive
            if not among.any():  # the last cohort standing
                alive[i] = True
                break
        t = nearest(centres.rows[i], centres, rules.numeric, among)
        into[c] = ids[t]
        size[t] += size[i]
    if not into:
        return False

    def final(c: int) -> int:  # a cohort merged into one that merged later
        while c in into:
            c = into[c]
        return c

    labels, inverse = np.unique(np.asarray(roster.cohort, dtype=np.int64), return_inverse=True)
    mapped = np.asarray([final(int(c)) for c in labels.tolist()], dtype=np.int64)
    roster.cohort = mapped[inverse.ravel()].tolist()
    return True


@dataclass(slots=True)
class _Published:
    class_of_row: NDArray[np.int32]
    tuples: list[list[Any]]
    weights: list[float]
    measures: dict[str, float]
    sizes: NDArray[np.int64]  # records in each class


def _publish(
    roster: Roster, members: dict[int, list[int]], rules: PanelRules, centroids: Centroids
) -> _Published:
    """Every active member's tuple and weight, linked sets updated."""
    n_rows = len(roster.keys)
    class_of_row = np.full(n_rows, -1, dtype=np.int32)
    cohorts = sorted(members)
    if not cohorts:
        return _Published(class_of_row, [], [], {}, np.zeros(0, dtype=np.int64))
    rows = [r for c in cohorts for r in members[c]]
    labels = np.repeat(np.arange(len(cohorts)), [len(members[c]) for c in cohorts])
    # the claim as columns, gathered once for the centroids and the raking
    cols = roster.carried.claim_columns(np.asarray(rows, dtype=np.intp))[: len(rules.numeric)]
    tuples = centroids(cols, labels)
    # one class per distinct published tuple (two cohorts publishing the same are one class)
    class_index: dict[tuple[Any, ...], int] = {}
    cohort_class = [class_index.setdefault(tuple(t), len(class_index)) for t in tuples]
    classes = [list(t) for t in class_index]
    class_of_row[rows] = np.asarray(cohort_class, dtype=np.int32)[labels]
    linked_sets = _linked(roster.linked, rows, labels, [frozenset(members[c]) for c in cohorts])
    sizes = np.bincount(class_of_row[rows], minlength=len(classes))
    weights, measures = _weights(
        roster, rows, class_of_row, classes, class_sizes=sizes, rules=rules, cols=cols
    )
    linked = np.fromiter(map(len, linked_sets), dtype=np.int64, count=len(rows))
    # a raised k merges cohorts from now on; the sets keep the history's smallest k
    promised = roster.history_k = min(roster.history_k or rules.k, rules.k)
    measures["linked_promised"] = float(promised)
    measures["linked_records"] = float(linked.size)
    measures["linked_below_k"] = float(np.count_nonzero(linked < promised))
    measures["linked_smallest"] = float(linked.min())
    measures["release_smallest_class"] = float(sizes.min())
    return _Published(class_of_row, classes, weights, measures, sizes)


def _linked(
    sets: list[Set[int]], rows: list[int], labels: NDArray[np.int64], groups: list[Set[int]]
) -> list[Set[int]]:
    """Each row's linked set narrowed to its cohort's ``groups[label]`` (stored in ``sets``
    and returned in ``rows``' order). Members of a cohort holding one set object share one
    intersection: the held sets are alive here, so an id names one."""
    held = list(map(sets.__getitem__, rows))
    pairs = list(zip(labels.tolist(), map(id, held), strict=True))
    met = {
        pair: (h & groups[pair[0]] if h else groups[pair[0]])
        for pair, h in dict(zip(pairs, held, strict=True)).items()
    }
    narrowed = list(map(met.__getitem__, pairs))
    deque(map(sets.__setitem__, rows, narrowed), maxlen=0)
    return narrowed


def _weights(
    roster: Roster,
    rows: list[int],
    class_of_row: NDArray[np.int32],
    classes: list[list[Any]],
    *,
    class_sizes: NDArray[np.int64],
    rules: PanelRules,
    cols: list[list[Any]],
) -> tuple[list[float], dict[str, float]]:
    """Raked weights per class, and what they achieve."""
    cls = class_of_row[rows]
    n_classes = len(class_sizes)
    sw = roster.carried.sampling[np.asarray(rows, dtype=np.intp)]
    sizes = class_sizes.astype(np.float64)
    base = np.bincount(cls, weights=sw, minlength=n_classes) / np.maximum(sizes, 1)
    margins: list[NDArray[np.int64]] = []
    targets: list[NDArray[np.float64]] = []
    for j, is_num in enumerate(rules.numeric):
        if is_num:
            continue
        current = cols[j]
        # a missing category is published as None
        published = [MISSING_LABEL if t[j] is None else t[j] for t in classes]
        # codes in order of first appearance (dict.fromkeys and map: in C)
        code = {v: i for i, v in enumerate(dict.fromkeys((*published, *current)))}
        margins.append(np.asarray([code[v] for v in published], dtype=np.int64))
        counted: NDArray[np.float64] = np.bincount(
            np.fromiter(map(code.__getitem__, current), dtype=np.int64, count=len(current)),
            weights=sw,
            minlength=len(code),
        ).astype(np.float64)
        targets.append(counted)
    raked = rake(sizes, base, margins, targets, rules.raking)
    record_weights = raked.weights[cls]
    measures = {
        "panel_weight_deff": kish_deff(record_weights),
        "panel_calibration_deff": kish_deff(raked.factors[cls]),
        "panel_marginal_gap": raked.max_gap,
        "panel_raking_converged": float(raked.converged),
    }
    return [float(w) for w in raked.weights], measures


def _stale(
    roster: Roster, rows_of: list[int | None], out: _Published, numeric: Sequence[bool]
) -> float:
    """Share of present respondents whose published categories differ from their current (the
    roster's claim of a member present is what it answered), a category at a time."""
    rows = np.asarray([r for r in rows_of if r is not None], dtype=np.intp)
    rows = rows[out.class_of_row[rows] >= 0]
    if not rows.size:
        return 0.0
    cls = out.class_of_row[rows]
    differ = np.zeros(rows.size, dtype=np.bool_)
    for j in _categorical(numeric):
        published = objects([MISSING_LABEL if t[j] is None else t[j] for t in out.tuples])
        differ |= published[cls] != roster.carried.claim[j][rows]
    return int(np.count_nonzero(differ)) / rows.size

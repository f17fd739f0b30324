"""MDAV over numeric, ordinal and nominal quasi-identifiers together (heterogeneous k-anonymity).

Domingo-Ferrer & Torra, "Ordinal, continuous and heterogeneous k-anonymity through
microaggregation", Data Mining and Knowledge Discovery 11(2), 2005: every quasi-identifier takes
part in one MDAV partition, so that all members of a group publish the same whole
quasi-identifier tuple and the published file is k-anonymous on all of them together.

* **Numeric**: squared difference, standardised by the attribute's population variance.
* **Ordinal** (ordered categories): distance by rank — the category's position in the policy's
  order, standardised like a numeric attribute; the group's centroid is its median category
  (the lower median, so it is always a category that a member has).
* **Nominal**: 0/1 distance (equal or not). A category is embedded as a one-hot vector scaled by
  1/√(1 - Σ f_c²), the attribute's total variance over the data, so that two random records
  differ by 2 on average, exactly as two random records do on a standardised numeric
  attribute: no attribute kind dominates the distance (privgw's own scaling; the paper uses the
  plain 0/1 distance, which lets a many-valued nominal attribute dominate).
* **Nominal attributes together**: a group publishes one of its members' combinations of
  nominal categories, so it never publishes a combination none of its members has
  (attribute-wise modes publish Husband with Female). It takes the member combination that
  agrees with most member cells (the group's medoid under the 0/1 distance), ties to the more
  frequent combination, then to the categories listed first: a plain joint mode, in groups of
  five mostly different combinations, would fall back on list order and bias the published
  marginals. Edit rules (:class:`EditRule`) name combinations never to publish: the group
  takes its best allowed member combination, and if every member's is forbidden, publishes
  the attributes of the rules it breaks suppressed (None).

**What is privgw's own, not the paper's.** Domingo-Ferrer & Torra define the nominal distance
as plain 0/1 (unscaled) and form each MDAV group around records found by that distance, with
the mode as the group's value. Here the 0/1 distance is scaled by 1/√(1 − Σ f_c²) (above), and
MDAV's "centroid" and "farthest record" steps use the mean of the one-hot rows (the category
frequencies within the remaining records), not the mode; only the published value is the mode.
Why: unscaled, a nominal attribute with many rare categories (native country) would weigh as
much as one with two equal ones (sex), and a 0/1 difference (at most 1) against standardised
numbers (differences of several units) would let the numbers decide nearly every group; the
scaling gives every attribute the same expected contribution. The one-hot mean makes MDAV's
centroid a point of the same space as the records, so the distances stay Euclidean and
``mdav_groups`` runs unchanged (the mode would make the centroid jump between categories).
Published groups are still k-anonymous on the whole tuple, whatever the distance.

The distance is the squared Euclidean distance between the embedded rows, so MDAV runs on the
embedded matrix unchanged (:func:`gateway.grouping.microaggregation.mdav_groups` with unit weights).
With numeric attributes only, the partition is sdcMicro 5.8.1's record for record (the
embedding is skipped and ``mdav_groups`` standardises exactly as sdcMicro does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError
from gateway.grouping.microaggregation import Block, class_means, mdav_blocks, mdav_groups
from gateway.grouping.refine import refine_groups
from gateway.mechanisms import masking
from gateway.policy import (
    MISSING_LABEL,
    Attribute,
    AttrType,
    Method,
    Policy,
    published_categories,
)

__all__ = [
    "EditRule",
    "QIColumn",
    "QIKind",
    "claim_column",
    "claim_columns",
    "claim_inputs",
    "embed",
    "mixed_centroids",
    "mixed_group_centroids",
    "mixed_microaggregate",
]


class QIKind(StrEnum):
    NUMERIC = "numeric"
    ORDINAL = "ordinal"
    NOMINAL = "nominal"


@dataclass(frozen=True, slots=True)
class QIColumn:
    """One quasi-identifier of the partition. ``categories``: the domain of an ordinal (in
    order) or nominal attribute (the order breaks ties between modes)."""

    name: str
    kind: QIKind
    categories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind is QIKind.NUMERIC:
            if self.categories:
                raise MechanismError(f"{self.name}: a numeric quasi-identifier has no categories")
        elif len(self.categories) < 1 or len(set(self.categories)) != len(self.categories):
            raise MechanismError(
                f"{self.name}: an {self.kind.value} quasi-identifier needs its categories, "
                "each listed once"
            )

    def codes(self, values: Sequence[object]) -> NDArray[np.int64]:
        """Category positions of ``values`` (categorical columns only)."""
        index = {c: i for i, c in enumerate(self.categories)}
        try:
            return np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))  # type: ignore[arg-type]
        except KeyError:
            raise MechanismError(
                f"{self.name}: a value outside the attribute's categories (or missing) cannot "
                "be microaggregated"
            ) from None


@dataclass(frozen=True, slots=True)
class EditRule:
    """A forbidden combination of nominal quasi-identifiers: a published tuple breaks the rule
    when, for every attribute named, its value is one of the listed categories."""

    values: tuple[tuple[str, frozenset[str]], ...]

    @classmethod
    def of(cls, rule: Mapping[str, Sequence[str]]) -> EditRule:
        if not rule:
            raise MechanismError("an edit rule names at least one attribute")
        return cls(tuple((name, frozenset(cats)) for name, cats in sorted(rule.items())))

    def breaks(self, published: Mapping[str, object]) -> bool:
        """Whether a published tuple (attribute -> value) is one this rule forbids."""
        return all(published.get(name) in cats for name, cats in self.values)


def _numeric(values: Sequence[object], name: str) -> NDArray[np.float64]:
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise MechanismError(f"{name}: non-numeric value in a numeric quasi-identifier") from None
    if not np.isfinite(arr).all():
        raise MechanismError(f"{name}: missing or non-finite value in a numeric quasi-identifier")
    return arr


def _standardised(a: NDArray[np.float64], standardize: bool) -> NDArray[np.float64]:
    if not standardize:
        return a
    sd = float(a.std())
    return (a - a.mean()) / sd if sd > 0 else np.zeros_like(a)


def embed(
    columns: Sequence[QIColumn], values: Sequence[Sequence[object]], *, standardize: bool = True
) -> NDArray[np.float64]:
    """The records (``values``: one sequence per column) as rows whose squared Euclidean
    distances are the heterogeneous distance of the module docstring."""
    return _embed(columns, values, standardize)[0]


def _embed(
    columns: Sequence[QIColumn], values: Sequence[Sequence[object]], standardize: bool
) -> tuple[NDArray[np.float64], list[Block], list[NDArray[Any] | None]]:
    """``embed``'s rows, the one-hot block (columns, present-category index) of each nominal
    column for MDAV's look-up, and per column what ``_centroids`` needs again: the category
    codes of a categorical column, the values of a numeric one."""
    if len(columns) != len(values):
        raise MechanismError(f"{len(columns)} columns described but {len(values)} given")
    n = len(values[0]) if values else 0
    # (first column, values) of a one-column part, (first column, category index, scale) of
    # a one-hot block: written straight into x once its width is known
    dense: list[tuple[int, NDArray[np.float64]]] = []
    onehots: list[tuple[int, NDArray[np.int64], float]] = []
    blocks: list[Block] = []
    known: list[NDArray[Any] | None] = []
    width = 0
    for col, vals in zip(columns, values, strict=True):
        if len(vals) != n:
            raise MechanismError("every quasi-identifier column needs one value per record")
        if col.kind is QIKind.NUMERIC:
            a = _numeric(vals, col.name)
            known.append(a)
            dense.append((width, _standardised(a, standardize)))
            width += 1
        elif col.kind is QIKind.ORDINAL:
            codes = col.codes(vals)
            known.append(codes)
            dense.append((width, _standardised(codes.astype(np.float64), standardize)))
            width += 1
        else:
            codes = col.codes(vals)
            known.append(codes)
            counts = np.bincount(codes, minlength=len(col.categories))
            present = np.flatnonzero(counts)
            index = np.cumsum(counts > 0) - 1  # category -> its column among the present ones
            inverse = index[codes]
            if standardize:
                # f = counts / n is exactly the column mean of the 0/1 one-hot matrix (a sum of
                # integers below 2^53, exact in any order, divided by n)
                f = counts[present] / n
                total_var = 1.0 - float(f @ f)
                # all records equal: the attribute separates nobody
                scale = 1.0 / np.sqrt(total_var) if total_var > 1e-12 else 0.0
            else:
                scale = 1.0 / np.sqrt(2.0)  # plain 0/1 distance
            onehots.append((width, inverse, float(1.0 * scale)))  # the value of onehot·scale
            blocks.append((np.arange(width, width + present.size), inverse))
            width += present.size
    x = np.zeros((n, width))
    for at, a in dense:
        x[:, at] = a
    rows = np.arange(n)
    for at, inverse, value in onehots:
        x[rows, at + inverse] = value
    return x, blocks, known


def mixed_centroids(
    columns: Sequence[QIColumn],
    values: Sequence[Sequence[object]],
    labels: NDArray[np.int64],
    rules: Sequence[EditRule] = (),
) -> list[list[object]]:
    """Each record's published value per column: group mean (numeric), lower median category
    (ordinal), and the joint mode of the nominal columns (the module docstring)."""
    return _centroids(columns, values, labels, [None] * len(columns), rules)


def mixed_group_centroids(
    columns: Sequence[QIColumn],
    values: Sequence[Sequence[object]],
    labels: NDArray[np.int64],
    rules: Sequence[EditRule] = (),
) -> list[NDArray[Any]]:
    """:func:`mixed_centroids` once a group: one array a column, entry g the value group g
    publishes (entries of labels no record has are meaningless)."""
    lab = np.asarray(labels, dtype=np.int64)
    return _group_centroids(columns, values, lab, [None] * len(columns), rules)


def _centroids(
    columns: Sequence[QIColumn],
    values: Sequence[Sequence[object]],
    labels: NDArray[np.int64],
    known: Sequence[NDArray[Any] | None],
    rules: Sequence[EditRule] = (),
) -> list[list[object]]:
    """``mixed_centroids`` with the category codes (numeric values) already computed where
    ``known`` has them."""
    lab = np.asarray(labels, dtype=np.int64)
    return [g[lab].tolist() for g in _group_centroids(columns, values, lab, known, rules)]


def _group_centroids(
    columns: Sequence[QIColumn],
    values: Sequence[Sequence[object]],
    lab: NDArray[np.int64],
    known: Sequence[NDArray[Any] | None],
    rules: Sequence[EditRule],
) -> list[NDArray[Any]]:
    """Each group's published value per column (:func:`mixed_group_centroids`)."""
    groups = int(lab.max()) + 1 if lab.size else 0
    out: list[NDArray[Any]] = []
    nominal: list[tuple[int, NDArray[np.int64]]] = []  # (column position, codes)
    for j, (col, vals, have) in enumerate(zip(columns, values, known, strict=True)):
        if col.kind is QIKind.NUMERIC:
            nums = _numeric(vals, col.name) if have is None else have
            out.append(class_means(nums, lab))
            continue
        codes = col.codes(vals) if have is None else have
        if col.kind is QIKind.NOMINAL:
            nominal.append((j, codes))
            out.append(_NONE)  # filled below, jointly
            continue
        order = np.lexsort((codes, lab))  # by group, then rank
        sorted_lab = lab[order]
        starts = np.searchsorted(sorted_lab, np.arange(groups))
        counts = np.bincount(lab, minlength=groups)
        chosen = codes[order][starts + (counts - 1) // 2]
        out.append(_labels_of(col)[chosen])
    if nominal:
        for j, column in zip(
            [j for j, _ in nominal],
            _joint_modes([columns[j] for j, _ in nominal], [c for _, c in nominal], lab, rules),
            strict=True,
        ):
            out[j] = column
    return out


_NONE = np.empty(0, dtype=object)


def _labels_of(col: QIColumn) -> NDArray[Any]:
    cats = np.empty(len(col.categories), dtype=object)
    for i, c in enumerate(col.categories):  # one by one: never a nested array
        cats[i] = c
    return cats


def _joint_modes(
    columns: Sequence[QIColumn],
    codes: Sequence[NDArray[np.int64]],
    lab: NDArray[np.int64],
    rules: Sequence[EditRule],
) -> list[NDArray[Any]]:
    """Each group's published nominal values: the member combination of its group that
    agrees with the most member cells (the group's medoid under the 0/1 distance: Σ over
    attributes of the members sharing its value), ties to the more frequent combination, then
    to the one whose codes come first; never one an edit rule forbids, unless every member's
    is — then the attributes of the rules it breaks are suppressed (None)."""
    combos, combo_of = _combinations(columns, codes)  # sorted: ties by code
    u = combos.shape[0]
    pairs, counts = np.unique(lab * u + combo_of, return_counts=True)
    group, combo = pairs // u, pairs % u
    groups = int(lab.max()) + 1 if lab.size else 0
    agree = np.zeros(pairs.size, dtype=np.int64)
    for j, (col, c) in enumerate(zip(columns, codes, strict=True)):
        m = len(col.categories)
        sharing = np.bincount(lab * m + c, minlength=groups * m)
        agree += sharing[group * m + combos[combo, j]]
    banned = _banned(columns, combos, rules)
    # per group: allowed first, then most agreement, more members, the first combination
    order = np.lexsort((combo, -counts, -agree, banned[combo], group))
    first = np.ones(order.size, dtype=bool)
    first[1:] = group[order][1:] != group[order][:-1]
    best = np.zeros(groups, dtype=np.int64)  # a label no record has: any combination
    best[group[order][first]] = combo[order][first]
    out = [_labels_of(col)[combos[best, j]] for j, col in enumerate(columns)]
    forbidden = banned[best]
    forbidden[np.setdiff1d(np.arange(groups), group)] = False
    if rules and forbidden.any():
        for g in np.flatnonzero(forbidden).tolist():
            published = {
                col.name: col.categories[combos[best[g], j]] for j, col in enumerate(columns)
            }
            hidden = {n for rule in rules if rule.breaks(published) for n, _ in rule.values}
            for j, col in enumerate(columns):
                if col.name in hidden:
                    out[j][g] = None
    return out


def _combinations(
    columns: Sequence[QIColumn], codes: Sequence[NDArray[np.int64]]
) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """The distinct rows of category codes, in lexicographic order, and each record's: one
    mixed-radix integer per record (its order is the rows' lexicographic order) makes this a
    one-dimensional unique, several times faster than ``np.unique(rows, axis=0)``."""
    radix = [len(col.categories) for col in columns]
    if math.prod(radix) >= 2**62:  # a code would overflow: the rows themselves
        combos, combo_of = np.unique(np.column_stack(codes), axis=0, return_inverse=True)
        return combos, combo_of.reshape(-1)
    code = np.zeros(codes[0].shape, dtype=np.int64)
    for c, m in zip(codes, radix, strict=True):
        code *= m
        code += c
    distinct, combo_of = np.unique(code, return_inverse=True)
    combos = np.empty((distinct.size, len(radix)), dtype=np.int64)
    for j in range(len(radix) - 1, -1, -1):
        combos[:, j] = distinct % radix[j]
        distinct = distinct // radix[j]
    return combos, combo_of.reshape(-1)


def _banned(
    columns: Sequence[QIColumn], combos: NDArray[np.int64], rules: Sequence[EditRule]
) -> NDArray[np.bool_]:
    """Whether each combination (rows of category codes) breaks an edit rule."""
    banned = np.zeros(combos.shape[0], dtype=bool)
    position = {col.name: j for j, col in enumerate(columns)}
    for rule in rules:
        hit = np.ones(combos.shape[0], dtype=bool)
        for name, cats in rule.values:
            j = position.get(name)
            if j is None:
                raise MechanismError(f"edit rule names {name}, which is not a nominal column")
            allowed = [i for i, c in enumerate(columns[j].categories) if c in cats]
            hit &= np.isin(combos[:, j], allowed)
        banned |= hit
    return banned


def mixed_microaggregate(
    columns: Sequence[QIColumn],
    values: Sequence[Sequence[object]],
    k: int,
    *,
    standardize: bool = True,
    rules: Sequence[EditRule] = (),
    refine: bool = False,
) -> tuple[list[list[object]], NDArray[np.int64]]:
    """MDAV over all columns together: the published values (one list per column) and the
    group label of each record. Every group has k..2k-1 members and one published tuple.
    ``refine``: MDAV's groups improved by exchanges between neighbours (``refine_groups``,
    in the distance MDAV uses)."""
    if not columns:
        raise MechanismError("no quasi-identifier to microaggregate")
    if all(c.kind is QIKind.NUMERIC for c in columns):
        x = np.column_stack([_numeric(v, c.name) for c, v in zip(columns, values, strict=True)])
        labels = mdav_groups(x, k, standardize=standardize)
        if refine:
            labels = refine_groups(embed(columns, values, standardize=standardize), labels, k)
        return mixed_centroids(columns, values, labels), labels
    x, blocks, codes = _embed(columns, values, standardize)
    labels = mdav_blocks(x, k, blocks)  # = mdav_groups(x, k, standardize=False)
    if refine:
        labels = refine_groups(x, labels, k, blocks=blocks)
    return _centroids(columns, values, labels, codes, rules), labels


# ---------------------------------------------------------------------------------------------
# From the policy
# ---------------------------------------------------------------------------------------------


def claim_column(name: str, attr: Attribute) -> QIColumn:
    """The partition's view of a k-claim attribute: numeric; ordinal (``ordered``); nominal
    over its domain, or over its generalized domain for method generalize."""
    if attr.type is AttrType.NUMERIC:
        return QIColumn(name, QIKind.NUMERIC)
    if attr.ordered:
        return QIColumn(name, QIKind.ORDINAL, tuple(attr.domain))
    return QIColumn(name, QIKind.NOMINAL, tuple(published_categories(attr)))


def claim_columns(policy: Policy) -> list[QIColumn]:
    """The k claim's attributes as partition columns, in policy order."""
    return [claim_column(n, policy.attributes[n]) for n in policy.k_claim]


def claim_inputs(attr: Attribute, values: Sequence[object]) -> list[object]:
    """A column of validated values as the partition takes them: numbers as floats;
    categories generalized where the method says so; a missing value as the missing
    category where it is one, else None (the record cannot be grouped)."""
    complete = None not in values  # (the usual window: every value there, mapped in C)
    if attr.type is AttrType.NUMERIC:
        if complete:
            return list(map(float, values))  # type: ignore[arg-type]
        return [None if v is None else float(v) for v in values]  # type: ignore[arg-type]
    texts: list[str | None]
    if complete and set(map(type, values)) <= {str}:
        texts = list(values)  # type: ignore[arg-type]  # validated categories: str already
    else:
        texts = [None if v is None else str(v) for v in values]
    if attr.method is Method.GENERALIZE:
        assert attr.hierarchy is not None
        texts = masking.generalize(texts, attr.hierarchy)
    if attr.missing_is_category:
        return [MISSING_LABEL if t is None else t for t in texts]
    return list(texts)

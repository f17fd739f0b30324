"""Counts of published categories per mechanism, for reconstructing from a stream without
keeping its rows (``privgw reconstruct --topic``).

Rows are added as they are read; memory is O(versions × attributes × categories), not O(rows).
A value is counted against the matrix it was drawn under: the one its stamp names
(``gateway.mechanisms.stamp``; a sticky draw keeps its matrix across policy versions), else the
one of its record's policy version. A stream is not trusted: a metadata record that does not
parse as a mechanism, a value outside its matrix's categories and a stamp that names no known
matrix are skipped and counted, never fatal — unless nothing of a version could be counted,
which means the metadata topic is the wrong one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.errors import InputDataError, PrivgwError
from gateway.measures.published import mechanisms_from_meta, published_code, releases_note
from gateway.measures.reconstruction import reconstruct
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.stamp import stamped_version


def _matrix_versions(meta: Mapping[str, Any]) -> dict[str, str]:
    rr = meta.get("randomized_response")
    out: dict[str, str] = {}
    if isinstance(rr, Mapping):
        for name, spec in rr.items():
            if isinstance(spec, Mapping) and isinstance(spec.get("matrix_version"), str):
                out[str(name)] = spec["matrix_version"]
    return out


class VersionedCounts:
    """Category counts per (policy version, attribute); each policy version's metadata
    (``metas``: policy version -> meta record) defines its matrices. Rows of a version without
    usable metadata are only counted, and left out of every estimate (:meth:`reconstruct`
    names them)."""

    def __init__(self, metas: Mapping[str, Mapping[str, Any]], *, wave: int | None = None) -> None:
        """``wave``: count only that release's rows (each version's wave attribute)."""
        self.mechanisms: dict[str, dict[str, RRMechanism]] = {}
        self.bad_metas: list[str] = []  # versions whose metadata is not a mechanism
        for version, meta in metas.items():
            try:
                self.mechanisms[version] = mechanisms_from_meta(meta)
            except (PrivgwError, ValueError, KeyError, TypeError, AttributeError):
                self.bad_metas.append(version)
        self._matrix = {v: _matrix_versions(metas[v]) for v in self.mechanisms}
        # (attribute, matrix version) -> the policy version whose metadata defines it
        self._by_matrix: dict[tuple[str, str], str] = {}
        for version in sorted(self.mechanisms):
            for name, mv in self._matrix[version].items():
                self._by_matrix.setdefault((name, mv), version)
        self.rows: dict[str, int] = {}  # rows read per version, with or without metadata
        self._index = {
            v: {a: {c: i for i, c in enumerate(m.categories)} for a, m in mechs.items()}
            for v, mechs in self.mechanisms.items()
        }
        self.counts = {
            v: {a: np.zeros(m.m, dtype=np.int64) for a, m in mechs.items()}
            for v, mechs in self.mechanisms.items()
        }
        # a panel release's analysis weight (its metadata names the field): weighted counts
        # and the sum of squared weights beside the plain counts, for Kish's effective size
        self._weight = {
            v: (metas[v].get("republication") or {}).get("weight_field") for v in self.mechanisms
        }
        self.weighted = {
            v: {a: np.zeros(m.m) for a, m in mechs.items()}
            for v, mechs in self.mechanisms.items()
            if self._weight[v]
        }
        self.squares: dict[str, dict[str, float]] = {v: {} for v in self.weighted}
        self.weighed: dict[str, Counter[str]] = {v: Counter() for v in self.weighted}
        # each version's wave attribute (its metadata names it): the releases a pool's rows
        # span divide the size its standard errors count (gateway.measures.published)
        self._wave_field = {
            v: (m.get("republication") or {}).get("wave_attribute")
            for v, m in metas.items()
            if isinstance(m, Mapping)
        }
        self.only_wave = wave
        self.waves: dict[str, dict[str, set[object]]] = {
            v: {a: set() for a in mechs} for v, mechs in self.mechanisms.items()
        }
        self.outside: Counter[tuple[str, str]] = Counter()  # values no category names
        self.unknown_matrix: Counter[tuple[str, str]] = Counter()  # stamps naming no matrix
        self.unreadable = 0  # records that are not JSON objects (the reader counts them)

    def add(self, version: str, row: Mapping[str, Any]) -> None:
        wave_field = self._wave_field.get(version)
        wave = row.get(wave_field) if isinstance(wave_field, str) else None
        if isinstance(wave, bool) or not isinstance(wave, int | float):
            wave = None
        if self.only_wave is not None and wave != self.only_wave:
            return
        self.rows[version] = self.rows.get(version, 0) + 1
        index = self._index.get(version)
        if index is None:
            return
        matrix = self._matrix[version]
        for name in index:
            if name not in row:
                continue
            target = version
            stamp = stamped_version(row, name)
            if stamp is not None and stamp != matrix.get(name):
                found = self._by_matrix.get((name, stamp))
                if found is None:
                    self.unknown_matrix[(version, name)] += 1
                    continue
                target = found
            code = published_code(row[name], self._index[target][name])
            if code == -1:
                self.outside[(version, name)] += 1
            elif code is not None:
                self.counts[target][name][code] += 1
                if wave is not None:
                    self.waves[target][name].add(wave)
                field = self._weight.get(target)
                weight = row.get(field) if field else None
                if isinstance(weight, int | float) and target in self.weighted:
                    self.weighted[target][name][code] += weight
                    squares = self.squares[target]
                    squares[name] = squares.get(name, 0.0) + float(weight) ** 2
                    self.weighed[target][name] += 1

    def without_meta(self) -> dict[str, int]:
        """Rows per policy version that has no metadata record (left out of the estimates)."""
        return {v: n for v, n in sorted(self.rows.items()) if v not in self.mechanisms}

    def skipped(self) -> dict[str, int]:
        """Rows and values left out, by why (no personal value: counts only)."""
        out = {
            "unreadable_records": self.unreadable,
            "values_outside_categories": sum(self.outside.values()),
            "values_of_unknown_matrix": sum(self.unknown_matrix.values()),
            "unusable_metadata_versions": len(self.bad_metas),
        }
        return {k: v for k, v in out.items() if v}

    def _effective(
        self, name: str, versions: Sequence[str], counts: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """A pool's counts, weighted when every version of it is a weighted panel release whose
        rows all carried their weight."""
        if not versions or any(v not in self.weighted for v in versions):
            return counts.astype(np.float64)
        if sum(self.weighed[v][name] for v in versions) != int(counts.sum()):
            return counts.astype(np.float64)  # some rows without their weight: unweighted
        weighted = sum(self.weighted[v][name] for v in versions)
        squares = sum(self.squares[v].get(name, 0.0) for v in versions)
        return _effective_counts(np.asarray(weighted, dtype=np.float64), squares, counts)

    def reconstruct(self) -> dict[str, Any]:
        """Per attribute: one estimate per group of versions with equal mechanisms (their
        counts pooled), and their combination over all rows (weights n_g / N; SEs combined
        as independent), when the groups share their categories."""
        for (version, name), n in sorted(self.outside.items()):
            if not self.counts[version][name].any():  # nothing fits: the wrong metadata
                raise InputDataError(
                    f"published column '{name}' of policy version {version} has {n} values "
                    "outside the categories of that version's metadata and none inside: read "
                    "the metadata topic that belongs to this topic (--meta-topic)"
                )
        skipped = self.without_meta()
        out: dict[str, Any] = {}
        names = sorted({a for mechs in self.mechanisms.values() for a in mechs})
        for name in names:
            pools: dict[tuple[Any, ...], tuple[RRMechanism, list[str], NDArray[np.int64]]] = {}
            for version in sorted(self.mechanisms):
                mech = self.mechanisms[version].get(name)
                counts = self.counts[version].get(name)
                if mech is None or counts is None or not counts.any():
                    continue
                key = (mech.categories, mech.matrix.shape, mech.matrix.tobytes())
                if key in pools:
                    pooled = pools[key]
                    pools[key] = (mech, [*pooled[1], version], pooled[2] + counts)
                else:
                    pools[key] = (mech, [version], counts.copy())
            if not pools:
                continue
            groups = []
            spans = []
            for mech, versions, counts in pools.values():
                releases = max(1, len(set().union(*(self.waves[v][name] for v in versions))))
                effective = self._effective(name, versions, counts) / releases
                est = reconstruct(mech, effective, counts=True).to_dict()
                if not np.array_equal(effective, counts):  # n stays the rows read
                    est["n_effective"], est["n"] = est["n"], int(counts.sum())
                if releases > 1:
                    est["releases"] = releases
                    spans.append(releases)
                groups.append({"policy_versions": versions, **est})
            entry = _combine(groups)
            if spans:
                entry.setdefault("notes", []).append(releases_note(max(spans)))
            entry["groups"] = groups
            entry["skipped_versions"] = skipped
            left_out = {
                "values_outside_categories": sum(
                    n for (_, a), n in self.outside.items() if a == name
                ),
                "values_of_unknown_matrix": sum(
                    n for (_, a), n in self.unknown_matrix.items() if a == name
                ),
            }
            entry["skipped_values"] = {k: v for k, v in left_out.items() if v}
            out[name] = entry
        return out


def _effective_counts(
    weighted: NDArray[np.float64], squares: float, counts: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Weighted shares over Kish's effective sample size (Σw)² / Σw²."""
    total = float(weighted.sum())
    if total <= 0 or squares <= 0:
        return counts.astype(np.float64)
    effective: NDArray[np.float64] = weighted / total * (total**2 / squares)
    return effective


def _combine(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The estimate over all groups' rows: Σ (n_g/N) π_g, SE² = Σ (n_g/N)² SE_g²."""
    categories = groups[0]["categories"]
    total = sum(int(g["n"]) for g in groups)
    if any(g["categories"] != categories for g in groups):
        return {
            "n": total,
            "notes": ["the policy versions publish different categories: no combined estimate"],
        }
    w = np.array([int(g["n"]) / total for g in groups])

    def mean(field: str) -> list[float]:
        return [float(x) for x in w @ np.array([g[field] for g in groups], dtype=float)]

    def se(field: str) -> list[float]:
        v = (w**2) @ np.array([g[field] for g in groups], dtype=float) ** 2
        return [float(x) for x in np.sqrt(v)]

    return {
        "categories": list(categories),
        "n": total,
        "observed": mean("observed"),
        "inversion": mean("inversion"),
        "inversion_se": se("inversion_se"),
        "em": mean("em"),
        "em_se": se("em_se"),
    }

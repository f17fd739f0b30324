"""Per-version category counts (``privgw reconstruct --topic``): each version against its own
mechanism, combined over versions, with clear errors (no published value in any message)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InputDataError
from gateway.measures.reconstruction import reconstruct
from gateway.measures.versioned_counts import VersionedCounts
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.rr_constructions import uniform


def _meta(version: str, mech: RRMechanism) -> dict[str, object]:
    return {"policy_version": version, "randomized_response": {"income": mech.to_dict()}}


def test_each_version_is_reconstructed_with_its_own_matrix_and_combined() -> None:
    a, b = uniform(["<=50K", ">50K"], retention=0.75), uniform(["<=50K", ">50K"], retention=0.6)
    counts = VersionedCounts({"va": _meta("va", a), "vb": _meta("vb", b)})
    rows = {"va": (700, 300), "vb": (520, 480)}
    for version, (low, high) in rows.items():
        for _ in range(low):
            counts.add(version, {"income": "<=50K"})
        for _ in range(high):
            counts.add(version, {"income": ">50K"})
    counts.add("vc", {"income": "<=50K"})  # no metadata: counted, left out
    est = counts.reconstruct()["income"]
    assert counts.without_meta() == {"vc": 1} and est["skipped_versions"] == {"vc": 1}
    ea = reconstruct(a, np.array(rows["va"]), counts=True)
    eb = reconstruct(b, np.array(rows["vb"]), counts=True)
    assert est["n"] == 2000
    assert est["em"] == pytest.approx((ea.em + eb.em) / 2)
    assert est["em_se"] == pytest.approx(np.sqrt(ea.em_se**2 + eb.em_se**2) / 2)
    assert [g["policy_versions"] for g in est["groups"]] == [["va"], ["vb"]]


def test_values_outside_the_categories_are_counted_not_named() -> None:
    counts = VersionedCounts({"va": _meta("va", uniform(["<=50K", ">50K"], retention=0.75))})
    counts.add("va", {"income": "<=50K"})
    counts.add("va", {"income": "secret-looking-value"})  # forged: skipped and counted
    est = counts.reconstruct()["income"]
    assert est["n"] == 1 and est["skipped_values"] == {"values_outside_categories": 1}
    assert "secret-looking-value" not in repr(est)
    only_outside = VersionedCounts({"va": _meta("va", uniform(["a", "b"], retention=0.75))})
    only_outside.add("va", {"income": "secret-looking-value"})
    with pytest.raises(InputDataError) as err:  # nothing fits: the wrong metadata
        only_outside.reconstruct()
    assert "'income'" in str(err.value) and "va" in str(err.value)
    assert "secret-looking-value" not in str(err.value)


def test_versions_with_other_categories_are_not_combined() -> None:
    two = uniform(["<=50K", ">50K"], retention=0.75)
    three = uniform(["low", "mid", "high"], retention=0.5)
    counts = VersionedCounts({"va": _meta("va", two), "vb": _meta("vb", three)})
    for _ in range(50):
        counts.add("va", {"income": "<=50K"})
        counts.add("vb", {"income": "mid"})
    est = counts.reconstruct()["income"]
    assert "categories" not in est and est["n"] == 100 and est["notes"]
    assert len(est["groups"]) == 2


def _panel_meta(version: str, mech: RRMechanism) -> dict[str, object]:
    return {**_meta(version, mech), "republication": {"wave_attribute": "wave"}}


@settings(max_examples=40, deadline=None)
@given(
    low=st.integers(1, 400),
    high=st.integers(1, 400),
    releases=st.integers(2, 6),
    weighted=st.booleans(),
)
def test_a_release_published_again_tells_no_more_than_once(
    low: int, high: int, releases: int, weighted: bool
) -> None:
    # a respondent's randomized answer is drawn once and repeated in every release: the same
    # rows read in W releases are one sample, not W (before, their SE shrank by sqrt(W))
    mech = uniform(["<=50K", ">50K"], retention=0.75)
    meta = {"va": _panel_meta("va", mech)}
    if weighted:
        meta["va"]["republication"] = {"wave_attribute": "wave", "weight_field": "weight"}
    rows = [{"income": "<=50K", "weight": 1.0 + i % 3} for i in range(low)]
    rows += [{"income": ">50K", "weight": 2.0 + i % 2} for i in range(high)]
    once, again = VersionedCounts(meta), VersionedCounts(meta)
    for row in rows:
        once.add("va", {**row, "wave": 1})
    for wave in range(1, releases + 1):
        for row in rows:
            again.add("va", {**row, "wave": wave})
    one, many = once.reconstruct()["income"], again.reconstruct()["income"]
    for field in ("inversion", "inversion_se", "em", "em_se"):
        assert many[field] == pytest.approx(one[field], rel=1e-6, abs=1e-9)
    assert many["n"] == releases * (low + high) and many["groups"][0]["releases"] == releases
    assert "releases" not in one["groups"][0] and "notes" not in one
    assert any(f"{releases} releases" in note for note in many["notes"])
    # one release of them: exactly the rows read once
    only = VersionedCounts(meta, wave=releases)
    for wave in range(1, releases + 1):
        for row in rows:
            only.add("va", {**row, "wave": wave})
    assert only.rows == {"va": low + high}
    assert only.reconstruct()["income"]["em_se"] == pytest.approx(one["em_se"])

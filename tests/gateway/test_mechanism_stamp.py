"""Each published randomized value names the matrix it was drawn under (issue 32, item 8).

The issue's reproduction: after an RR-matrix change, records stamped with the new policy version
carried sticky draws made under the old matrix, and reconstruction with the new matrix put
P(>50K) at 0.354 ± 0.014 against a truth of 0.247. One forged record or metadata record made the
whole reconstruction exit 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.measures.versioned_counts import VersionedCounts
from gateway.mechanisms.stamp import stamp_column
from gateway.policy import Policy, load_policy
from gateway.validation import Validator
from state.memory_store import MemoryStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[2]
ADULT = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
RETENTION = "rr: {mode: uniform, retention: 0.75}"
assert RETENTION in ADULT, "the Adult policy changed: update this test"
N = 6000


def _policy(tmp: Path, name: str, retention: str) -> Policy:
    path = tmp / f"{name}.yaml"
    path.write_text(ADULT.replace(RETENTION, RETENTION.replace("0.75", retention)))
    return load_policy(path)


def _records(policy: Policy, first_offset: int) -> list[ValidRecord]:
    validator = Validator(policy)
    survey = PanelSurvey(respondents=N, waves=1, seed=8, new_share=0.0, rows=load_rows())
    out = []
    for i, (key, value) in enumerate(encode(r) for r in survey.records()):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        out.append(ValidRecord(rid, values, SourceRef("in", 0, first_offset + i, 1000), 0.0))
    return out


def _rows(engine: Engine, records: list[ValidRecord]) -> list[dict[str, object]]:
    rows = []
    for start in range(0, len(records), 5000):
        result = engine.protect_window(records[start : start + 5000], now=0.0, flush_all=True)
        rows += [orjson.loads(p.value) for p in result.published]
    return rows


def _share_high(counts: VersionedCounts) -> tuple[float, float]:
    est = counts.reconstruct()["income"]
    i = est["categories"].index(">50K")
    return est["em"][i], est["em_se"][i]


def test_a_matrix_change_keeps_each_sticky_value_counted_under_its_own_matrix(
    tmp_path: Path,
) -> None:
    old, new = _policy(tmp_path, "old", "0.9"), _policy(tmp_path, "new", "0.55")
    store, keyring = MemoryStore(), Keyring(b"stamp-test-secret-0123456789abcdef")
    first = Engine(old, keyring=keyring, store=store)
    second = Engine(new, keyring=keyring, store=store)
    records = _records(old, 0)
    truth = np.mean([r.values["income"] == ">50K" for r in records])
    _rows(first, records)
    again = _rows(second, _records(new, N))  # the same answers, after the matrix changed

    column = stamp_column("income")
    old_mv = first.metadata()["randomized_response"]["income"]["matrix_version"]  # type: ignore[index]
    new_mv = second.metadata()["randomized_response"]["income"]["matrix_version"]  # type: ignore[index]
    assert old_mv != new_mv
    assert {r[column] for r in again} == {old_mv}  # every draw republished: the old matrix's

    metas = {first.version: first.metadata(), second.version: second.metadata()}
    counts = VersionedCounts(metas)
    for row in again:
        counts.add(second.version, row)
    est, se = _share_high(counts)
    assert abs(est - truth) < 4 * se, (est, se, truth)

    # what reconstruction did before: the new matrix applied to old draws
    unstamped = VersionedCounts(metas)
    for row in again:
        unstamped.add(second.version, {k: v for k, v in row.items() if k != column})
    wrong, _ = _share_high(unstamped)
    assert abs(wrong - truth) > 4 * se, (wrong, se, truth)  # a bias far beyond sampling error


def test_forged_rows_and_metadata_are_skipped_and_counted(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "p", "0.75")
    engine = Engine(policy, keyring=Keyring(b"stamp-test-secret-0123456789abcdef"),
                    store=MemoryStore())  # fmt: skip
    rows = _rows(engine, _records(policy, 0)[:2000])
    forged_meta = {"policy_version": "forged", "randomized_response": {"income": {"x": 1}}}
    counts = VersionedCounts({engine.version: engine.metadata(), "forged": forged_meta})
    for row in rows:
        counts.add(engine.version, row)
    counts.add(engine.version, {**rows[0], "income": "CANARY-forged-value"})
    counts.add(engine.version, {**rows[0], stamp_column("income"): "no-such-matrix"})
    counts.add("forged", rows[0])
    income = counts.reconstruct()["income"]
    assert income["n"] == 2000
    assert income["skipped_values"] == {
        "values_outside_categories": 1,
        "values_of_unknown_matrix": 1,
    }
    assert counts.skipped() == {
        "values_outside_categories": 1,
        "values_of_unknown_matrix": 1,
        "unusable_metadata_versions": 1,
    }
    assert "CANARY" not in repr(income)


def test_a_column_with_no_value_of_its_metadata_is_the_wrong_metadata() -> None:
    from gateway.errors import InputDataError  # noqa: PLC0415
    from gateway.mechanisms.rr_constructions import uniform  # noqa: PLC0415

    meta = {"policy_version": "va", "randomized_response": {
        "income": uniform(["<=50K", ">50K"], retention=0.75).to_dict()}}  # fmt: skip
    counts = VersionedCounts({"va": meta})
    counts.add("va", {"income": "low"})
    with pytest.raises(InputDataError, match=r"none inside"):
        counts.reconstruct()

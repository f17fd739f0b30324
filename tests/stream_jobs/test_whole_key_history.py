"""k-anonymity on the whole quasi-identifier tuple, over the whole publication history (issue
18): a worker protects four waves of a simulated panel in which respondents change numeric and
categorical quasi-identifiers between waves. Counted over everything it published:

* 0 published tuples of the k claim's attributes (all nine quasi-identifiers together, exactly
  as published) shared by fewer than k distinct respondents; fully suppressed rows apart;
* unchanged respondents republished identically (randomized answers and the whole tuple);
* canaries: no raw amount of a sensitive numeric attribute and no raw ``submitted_at`` (to the
  second) anywhere in the output topic's bytes (keys, values, headers).

The worker's metrics watch the same history: no sampled window reported a class below k.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from streamkit import (
    accounted,
    assert_consistent_republication,
    consume_all,
    create_topics,
    k_claim,
    make_worker,
    produce_waves,
    published_qi_groups,
    run_until,
    settings_for,
    small_window_policy,
)

from gateway.measures.attack import intersection_attack
from gateway.policy import AttrType, load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.ops.metrics import GatewayMetrics

pytestmark = pytest.mark.broker

RR = ("occupation", "income")
WAVES = 4
# distinctive amounts inside the coding ranges (capital_gain [0, 20000], capital_loss [0, 2500])
CANARY_GAIN, CANARY_LOSS = 12345.67, 1234.56
CANARIES = 12  # respondents carrying them
MOVERS = 60  # respondents who change workclass, relationship and hours from wave 3 on


def _panel() -> list[dict[str, Any]]:
    """Four waves; the simulator changes one answer of 15% of respondents per wave (some of
    them categorical quasi-identifiers); on top, ``MOVERS`` respondents change three
    quasi-identifiers at once from wave 3 on, and ``CANARIES`` carry the canary amounts."""
    records = list(
        PanelSurvey(
            respondents=500, waves=WAVES, change_share=0.15, new_share=0.05, seed=18,
            rows=load_rows(),
        ).records()
    )  # fmt: skip
    ids = sorted({str(r["respondent_id"]) for r in records if r["wave"] == 1})
    canaries, movers = set(ids[:CANARIES]), set(ids[CANARIES : CANARIES + MOVERS])
    for r in records:
        rid = str(r["respondent_id"])
        if rid in canaries:
            r["capital_gain"], r["capital_loss"] = CANARY_GAIN, CANARY_LOSS
        if rid in movers and r["wave"] >= 3:
            r["workclass"] = "Self-emp-inc" if r["workclass"] != "Self-emp-inc" else "State-gov"
            r["relationship"] = "Unmarried" if r["relationship"] != "Unmarried" else "Wife"
            r["hours_per_week"] = min(99, int(r["hours_per_week"]) + 17)
    return records


@pytest.mark.parametrize(
    ("engine", "shards", "mode"),
    [("process", None, "regroup"), ("thread", 2, "regroup"), ("process", None, "cohort")],
)
def test_whole_key_is_k_anonymous_over_history_and_raw_values_never_leave(  # noqa: PLR0917
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    engine: str,
    shards: int | None,
    mode: str,
) -> None:
    path = small_window_policy(tmp_path, 300, mode=mode)
    policy = load_policy(path)
    assert policy.republication.mode.value == mode
    k = policy.microaggregation.k
    qis = k_claim()
    assert set(qis) == set(policy.k_claim) and len(qis) == 9  # numeric and categorical
    assert not policy.unprotected_quasi_identifiers
    categorical = [q for q in qis if policy.attributes[q].type is AttrType.CATEGORICAL]
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        flush_held_on_shutdown=True,
        engine=engine,
        engine_shards=shards,
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = _panel()
    waves = [[encode(r) for r in panel if r["wave"] == w] for w in range(1, WAVES + 1)]
    sent: list[Any] = []

    worker = make_worker(policy, settings, secret_env)
    metrics = GatewayMetrics.create(CollectorRegistry())
    metrics.attach(worker)

    def feed() -> None:  # each wave consumed whole before the next is sent: none is late
        produce_waves(broker.bootstrap, topics.input, waves, worker, sent, seconds=30)

    code = asyncio.run(
        run_until(worker, lambda w: accounted(w, len(panel)), during=feed, timeout=50)
    )
    assert code == 0
    st = worker.stats
    assert st.consumed == len(panel) and not st.dlq
    out = consume_all(broker.bootstrap, topics.output, expected=st.published)
    assert len(out) == st.published == len(panel)  # the held ones flushed at shutdown

    source = {f"{topics.input}/{s.partition}/{s.offset}".encode(): s for s in sent}
    first: dict[bytes, bytes] = {}
    for m in out:
        assert first.setdefault(m.headers["record_id"], m.value or b"") == m.value
    assert set(first) == set(source)
    truth = {rid: orjson.loads(source[rid].value or b"") for rid in first}
    rows = {rid: orjson.loads(v) for rid, v in first.items()}
    ids = list(first)

    # the test exercises what it claims: categorical quasi-identifiers changed between waves
    answers: dict[str, dict[int, dict[str, Any]]] = {}
    tuples: dict[str, set[tuple[Any, ...]]] = {}
    for rid in ids:
        t = truth[rid]
        answers.setdefault(t["respondent_id"], {})[int(t["wave"])] = t
        if any(rows[rid][q] is not None for q in qis):
            tuples.setdefault(t["respondent_id"], set()).add(tuple(rows[rid][q] for q in qis))
    changed_categorical = sum(
        1
        for by_wave in answers.values()
        if len({tuple(w[q] for q in categorical) for w in by_wave.values()}) > 1
    )
    assert changed_categorical >= MOVERS
    # regroup: a respondent whose categories changed moves to a group formed from its current
    # values (its tuple changes); none stays behind in its old group (no deferred move).
    # cohort: it stays, and an intruder following anyone across the waves keeps k candidates
    moved = sum(1 for ts in tuples.values() if len(ts) > 1)
    assert metrics.deferred_moves == 0
    if mode == "regroup":
        assert moved >= MOVERS
    else:
        waves_published: dict[int, dict[str, Any]] = defaultdict(dict)
        for rid in ids:
            t = truth[rid]
            published_qi = tuple(rows[rid][q] for q in qis)
            waves_published[int(t["wave"])][t["respondent_id"]] = (
                None if all(v is None for v in published_qi) else published_qi
            )
        linked = intersection_attack([waves_published[w] for w in sorted(waves_published)], k)
        assert linked.respondents > 0 and linked.below_k == 0, linked.smallest
        assert metrics.republication.last.get("linked_smallest", k) >= k
    # the policy's edit rules: no published combination of categories it forbids
    for rid in ids:
        row = rows[rid]
        assert (row["relationship"], row["sex"]) not in {("Husband", "Female"), ("Wife", "Male")}
        if row["relationship"] in ("Husband", "Wife"):
            assert row["marital_status"] in (None, "Married")

    # every published tuple of the whole k claim: >= k distinct respondents over the history
    owners = [truth[rid]["respondent_id"] for rid in ids]
    groups = published_qi_groups([rows[rid] for rid in ids], owners, qis)
    small = {t: len(m) for t, m in groups.items() if len(m) < k}
    assert groups
    assert len(small) == 0, f"{len(small)} published tuples below k = {k}"
    suppressed = sum(1 for rid in ids if all(rows[rid][q] is None for q in qis))
    # suppression is all or nothing: a null number means a suppressed row (a null category
    # is the missing category "?" of workclass / native_country, a value of its own above)
    numeric = [q for q in qis if q not in categorical]
    assert all(
        all(rows[rid][q] is None for q in qis)
        for rid in ids
        if any(rows[rid][q] is None for q in numeric)
    )
    # the categorical quasi-identifiers are aggregated, not copied: some published differ
    altered = sum(
        1
        for rid in ids
        if rows[rid][qis[0]] is not None
        and any(rows[rid][q] != truth[rid][q] for q in categorical if q != "marital_status")
    )
    assert altered > 0

    # identical republication for unchanged respondents (RR answers and the whole tuple)
    checked = assert_consistent_republication(first, source, rr=RR, qis=qis)
    assert checked > 2 * len(answers)

    # canaries: no raw sensitive amount, no raw timestamp anywhere in the output topic
    blob = b"\n".join(b"".join([m.key or b"", m.value or b"", *m.headers.values()]) for m in out)
    for canary in (CANARY_GAIN, CANARY_LOSS):
        assert orjson.dumps(canary) not in blob
        assert str(canary).encode() not in blob
    stamps = {str(t["submitted_at"]) for t in truth.values()}
    assert len(stamps) > len(answers)  # to the second: nearly every record its own
    leaked = [s for s in stamps if s.encode() in blob or s[:19].encode() in blob]
    assert not leaked, f"{len(leaked)} raw submitted_at values published"
    canary_rows = [rows[rid] for rid in ids if truth[rid]["capital_gain"] == CANARY_GAIN]
    assert len(canary_rows) >= CANARIES * (WAVES - 1)
    for name, raw in (("capital_gain", CANARY_GAIN), ("capital_loss", CANARY_LOSS)):
        published = [r[name] for r in canary_rows]
        assert all(v is None or v != raw for v in published), name
        assert any(v is not None for v in published), f"{name} never published"

    # the worker's own whole-key measures agree: no sampled window saw a class below k
    assert metrics.sampled_windows > 0
    assert metrics.key_class_violations == 0
    smallest = metrics.key_last.get("key_smallest_class")
    assert smallest is not None and smallest >= k
    print(
        f"whole key over {WAVES} waves ({engine}, shards {shards}): {len(ids)} records, "
        f"{len(answers)} respondents, "
        f"{len(groups)} published tuples (smallest {min(len(m) for m in groups.values())}), "
        f"{suppressed} suppressed, {changed_categorical} changed a categorical QI, "
        f"{moved} published with several tuples, {metrics.deferred_moves} deferred moves, "
        f"{checked} republications checked"
    )

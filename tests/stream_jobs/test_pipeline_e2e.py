"""The streaming gateway end to end on the real development broker.

Records go in with confluent-kafka (librdkafka: an independent client), the worker runs
in-process (its Faust app, aiokafka underneath, a SQLite state store), and what it published is
read back with confluent-kafka.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from streamkit import (
    accounted,
    consume_all,
    create_topics,
    k_claim,
    make_worker,
    produce,
    published_qi_groups,
    regroup_policy_path,
    run_until,
    settings_for,
)

from gateway.measures.reconstruction import reconstruct
from gateway.mechanisms.randomized_response import from_dict
from gateway.policy import load_policy, policy_from_yaml
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ADULT = regroup_policy_path()
QIS = k_claim()  # the whole quasi-identifier tuple the k claim covers


def _bad_records(good: bytes) -> list[tuple[bytes | None, bytes | None, str]]:
    """(key, value, expected DLQ reason) — one of several kinds of bad input."""
    rec = orjson.loads(good)
    unknown = dict(rec, income="maybe")
    missing = {k: v for k, v in rec.items() if k != "age"}
    extra = dict(rec, shoe_size=44)
    return [
        (b"bad-1", b"{not json", "invalid_json"),
        (b"bad-2", b"\xff\xfe\x00garbage", "invalid_utf8"),
        (b"bad-3", orjson.dumps(unknown), "unknown_category"),
        (b"bad-4", orjson.dumps(missing), "missing_field"),
        (b"bad-5", orjson.dumps(extra), "extra_field"),
        (b"bad-6", good.replace(b'"age":', b'"age":NaN,"x":', 1), "non_finite"),
        (b"bad-7", b"", "empty_message"),
    ]


@pytest.mark.parametrize(
    ("engine", "shards"), [("thread", None), ("process", None), ("process", 2), ("thread", 2)]
)
def test_panel_is_protected_counted_grouped_and_reconstructable(  # noqa: PLR0917
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    engine: str,
    shards: int | None,
) -> None:
    policy = load_policy(ADULT)
    k = policy.microaggregation.k
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path,
        flush_held_on_shutdown=True,
        engine=engine,
        engine_shards=shards,
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    survey = list(PanelSurvey(respondents=700, waves=3, seed=11, rows=load_rows()).records())
    good = [encode(r) for r in survey]
    bad = _bad_records(good[0][1])
    inputs = [*good[:500], *[(kk, v) for kk, v, _ in bad], *good[500:]]
    sent: list = []

    def feed() -> None:
        sent.extend(produce(broker.bootstrap, topics.input, inputs))

    worker = make_worker(policy, settings, secret_env)
    code = asyncio.run(run_until(worker, lambda w: accounted(w, len(inputs)), during=feed))
    assert code == 0
    st = worker.stats
    assert st.consumed == len(inputs)

    out = consume_all(broker.bootstrap, topics.output, expected=st.published)
    dlq = consume_all(broker.bootstrap, topics.dlq, expected=len(bad))
    # count in = out + DLQ, and each input offset is accounted for exactly once
    assert len(out) + len(dlq) == len(inputs)
    source = {f"{topics.input}/{s.partition}/{s.offset}": s for s in sent}
    out_ids = [m.headers["record_id"].decode() for m in out]
    dlq_ids = [
        f"{m.headers['source_topic'].decode()}/{m.headers['source_partition'].decode()}/"
        f"{m.headers['source_offset'].decode()}"
        for m in dlq
    ]
    assert sorted(out_ids + dlq_ids) == sorted(source)
    for m in out:
        assert m.headers["policy_version"] == policy.version.encode()
        assert len(m.headers["window_id"]) == 16
        assert m.key is None  # pseudonym: drop
    # the DLQ keeps the raw bytes and says why
    expected_reason = {v: reason for _, v, reason in bad}
    for m, rid in zip(dlq, dlq_ids, strict=True):
        assert m.value == (source[rid].value or b"")
        assert m.headers["reason"].decode() == expected_reason[m.value or b""]
        assert m.headers["error_class"]

    # every published centroid is shared by >= k distinct respondents
    rows = [orjson.loads(m.value or b"") for m in out]
    owners = [orjson.loads(source[i].value or b"")["respondent_id"] for i in out_ids]
    groups = published_qi_groups(rows, owners, QIS)
    assert groups, "no microaggregated record was published"
    assert min(len(members) for members in groups.values()) >= k
    assert not any("respondent_id" in r for r in rows)

    # the metadata topic lets an analyst reconstruct income within its standard error:
    # wave 1 = one record per respondent (later waves repeat the same sticky draws)
    meta = orjson.loads(consume_all(broker.bootstrap, topics.meta, expected=1)[-1].value or b"")
    mech = from_dict(meta["randomized_response"]["income"])
    truth_by_id = {i: orjson.loads(source[i].value or b"") for i in out_ids if i in source}
    wave1 = [
        (row["income"], truth_by_id[i]["income"])
        for row, i in zip(rows, out_ids, strict=True)
        if truth_by_id[i]["wave"] == 1
    ]
    codes = [mech.categories.index(pub) for pub, _ in wave1]
    est = reconstruct(mech, np.array(codes))
    true_share = np.mean([t == ">50K" for _, t in wave1])
    j = mech.categories.index(">50K")
    assert math.isfinite(est.em_se[j]) and est.em_se[j] > 0
    # 3.3 standard errors: a false alarm about once in a thousand runs
    assert abs(est.em[j] - true_share) <= 3.3 * est.em_se[j]
    assert abs(est.inversion[j] - true_share) <= 3.3 * est.inversion_se[j]

    # the analyst's command reads the same topics
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "reconstruct",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topics.output,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert "income" in orjson.dumps(report).decode()


HOLD_POLICY = """
name: hold-test
input: {topic: hold.in, respondent_id: rid}
output: {topic: hold.out, pseudonym: drop}
window: {max_records: 1000, max_seconds: 0.3, max_hold_seconds: 1.5, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age:   {role: quasi_identifier, type: numeric, method: microaggregation}
  hours: {role: quasi_identifier, type: numeric, method: microaggregation}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.75}
"""


def _hold_rows(n: int) -> list[tuple[bytes, bytes]]:
    """``n`` respondents of HOLD_POLICY's shape, ages 30, 31, …"""
    return [
        (f"r{i}".encode(), orjson.dumps({"rid": f"r{i}", "age": 30 + i, "hours": 40, "occ": "a"}))
        for i in range(n)
    ]


def test_records_short_of_k_wait_then_are_suppressed_never_published_alone(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = policy_from_yaml(HOLD_POLICY)
    settings = settings_for(broker.bootstrap, unique_name, tmp_path, partitions=1)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    lonely = _hold_rows(2)

    def feed() -> None:
        produce(broker.bootstrap, topics.input, lonely)

    worker = make_worker(policy, settings, secret_env)
    # done once both were published: that can only happen through the hold timeout
    code = asyncio.run(run_until(worker, lambda w: w.stats.published >= 2, during=feed, timeout=30))
    assert code == 0
    assert worker.stats.suppressed == 2
    out = consume_all(broker.bootstrap, topics.output, expected=2)
    rows = [orjson.loads(m.value or b"") for m in out]
    assert len(rows) == 2
    assert all(r["age"] is None and r["hours"] is None for r in rows)
    assert all(r["occ"] in {"a", "b", "c", "d"} for r in rows)


def test_a_drained_input_closes_its_window_after_max_idle_seconds_not_max_seconds(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """Six records and then nothing: with max_idle_seconds their window closes once the
    fetches find the input drained and quiet, long before the window's 60 s."""
    text = HOLD_POLICY.replace(
        "window: {max_records: 1000, max_seconds: 0.3,",
        "window: {max_records: 1000, max_seconds: 60, max_idle_seconds: 0.2,",
    ).replace("max_hold_seconds: 1.5", "max_hold_seconds: 60")
    policy = policy_from_yaml(text)
    assert policy.window.max_idle_seconds == 0.2
    settings = settings_for(broker.bootstrap, unique_name, tmp_path, partitions=1)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    rows = _hold_rows(6)
    worker = make_worker(policy, settings, secret_env)
    t0 = time.monotonic()
    code = asyncio.run(
        run_until(
            worker,
            lambda w: w.stats.published >= 6,
            during=lambda: produce(broker.bootstrap, topics.input, rows),
            timeout=40,
        )
    )
    assert code == 0
    assert worker.stats.published == 6 and worker.stats.suppressed == 0
    assert time.monotonic() - t0 < 30  # the window's 60 s would end the run at 40 s

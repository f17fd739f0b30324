"""recode_suppress through the real broker and worker (engine in its child process): three
waves of an Adult panel, each decided whole when the next begins. Counted over everything
published: every exact published key tuple (an empty cell a value of its own) has ≥ k
respondents in its wave; each published key value is the recoded truth or empty; an
unchanged respondent's suppressed cells stay suppressed; the worker's whole-key metrics saw
no class below k."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from streamkit import accounted, consume_all, create_topics, make_worker, produce_waves, run_until
from streamkit import settings_for as base_settings

from gateway.grouping.mixed_microaggregation import claim_inputs
from gateway.grouping.recode_stream import RecodeStream
from gateway.policy import load_policy
from gateway.validation import Validator
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.ops.metrics import GatewayMetrics

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
WAVES = 3


def _policy(tmp: Path) -> Path:
    text = (ROOT / "deploy" / "policies" / "adult_recode.yaml").read_text()
    old = "  max_records: 5000\n  max_seconds: 2\n  max_hold_seconds: 30\n"
    assert old in text, "adult_recode.yaml's window changed: update this test"
    path = tmp / "policy.yaml"
    path.write_text(
        text.replace(old, "  max_records: 300\n  max_seconds: 1\n  max_hold_seconds: 3\n")
    )
    return path


def test_recoded_waves_keep_exact_k_and_sticky_suppression_through_the_broker(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(_policy(tmp_path))
    k, keys = policy.microaggregation.k, policy.k_claim
    settings = base_settings(
        broker.bootstrap, unique_name, tmp_path / "state", flush_held_on_shutdown=True
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = list(
        PanelSurvey(
            respondents=400, waves=WAVES, change_share=0.15, seed=31, rows=load_rows()
        ).records()
    )
    waves = [[encode(r) for r in panel if r["wave"] == w] for w in range(1, WAVES + 1)]
    sent: list[Any] = []
    worker = make_worker(policy, settings, secret_env)
    registry = CollectorRegistry()
    metrics = GatewayMetrics.create(registry)
    metrics.attach(worker)

    def feed() -> None:  # each wave consumed whole before the next is sent: none is late
        produce_waves(broker.bootstrap, topics.input, waves, worker, sent, seconds=20)

    code = asyncio.run(
        run_until(worker, lambda w: accounted(w, len(panel)), during=feed, timeout=50)
    )
    assert code == 0 and worker.stats.consumed == len(panel) and not worker.stats.dlq
    out = consume_all(broker.bootstrap, topics.output, expected=worker.stats.published)
    first: dict[bytes, bytes] = {}
    for m in out:
        assert first.setdefault(m.headers["record_id"], m.value or b"") == m.value
    source = {f"{topics.input}/{s.partition}/{s.offset}".encode(): s for s in sent}
    assert set(first) == set(source)  # every record published (held ones flushed at the end)

    validator = Validator(policy)
    recoder = RecodeStream(policy, lambda rows: [])
    classes: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    seen: dict[str, list[tuple[int, tuple[Any, ...], tuple[Any, ...]]]] = defaultdict(list)
    for rid, value in first.items():
        respondent, values = validator.decode_and_validate(  # type: ignore[misc]
            source[rid].value, source[rid].key
        )
        cols = [claim_inputs(policy.attributes[n], [values.get(n)]) for n in keys]
        truth = recoder.recoded(cols)[0]
        row = orjson.loads(value)
        shown = tuple(row[n] for n in keys)
        assert all(s is None or s == t for s, t in zip(shown, truth, strict=True))
        if any(v is not None for v in shown):
            classes[row["wave"], shown].add(str(respondent))
        seen[str(respondent)].append((int(row["wave"]), truth, shown))
    small = {key: len(m) for key, m in classes.items() if len(m) < k}
    assert classes and not small, f"exact classes below k = {k} in a wave: {small}"
    # the live counter of suppressed cells per key: what the output shows (nothing withheld
    # here, so an all-empty row is a fully suppressed class and its cells count)
    assert worker.stats.suppressed == 0
    shown_cells = dict.fromkeys(keys, 0)
    for history in seen.values():
        for _, truth, shown in history:
            for n, t, v in zip(keys, truth, shown, strict=True):
                shown_cells[n] += v is None and t is not None
    for n in keys:
        got = registry.get_sample_value("privgw_suppressed_cells_total", {"attribute": n})
        assert got == shown_cells[n], n
    assert shown_cells["native_country"] > 0
    kept = 0
    for history in seen.values():
        history.sort(key=lambda h: h[0])
        for (_, t0, s0), (_, t1, s1) in itertools.pairwise(history):
            if t0 == t1:
                assert all(b is not None or a is None for a, b in zip(s1, s0, strict=True))
                kept += sum(a is None and t is not None for a, t in zip(s0, t0, strict=True))
    assert kept > 0  # suppressed cells of unchanged respondents were there to keep
    assert metrics.key_class_violations == 0 and metrics.k_violations == 0
    assert metrics.key_last.get("key_smallest_class", k) >= k

"""A changelog that cannot be restored stops the worker before it publishes (issue 32, item 2).

The issue's reproduction: one tombstone in the changelog made the restore fail inside the
rebalance listener, whose errors the client only logs; the worker kept publishing with a partial
state and 176 of 1,525 unchanged respondents got a new quasi-identifier tuple.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from streamkit import (
    assert_consistent_republication,
    consume_all,
    create_input_topic,
    k_claim,
    make_worker,
    produce,
    regroup_policy_path,
    run_until,
    settings_for,
)

from gateway.policy import load_policy
from stream_jobs.app import serve
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.partitions.changelog import RestoreError

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _policy(tmp: Path) -> Any:
    text = (regroup_policy_path()).read_text()
    path = tmp / "policy.yaml"
    path.write_text(text.replace("max_hold_seconds: 30", "max_hold_seconds: 2"))
    return load_policy(path)


@pytest.mark.parametrize("damage", ["tombstone", "corrupt"])
def test_an_unrestorable_changelog_stops_the_worker_before_it_publishes(
    damage: str, broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = _policy(tmp_path)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    create_input_topic(broker.bootstrap, in_topic, partitions=3)
    panel = PanelSurvey(respondents=300, waves=2, seed=2, new_share=0.0, rows=load_rows())
    waves: dict[int, list[Any]] = {}
    for r in panel.records():
        waves.setdefault(int(r["wave"]), []).append(encode(r))

    def run(state: str, published: int) -> Any:
        settings = settings_for(
            broker.bootstrap, unique_name, tmp_path / state, state_backend="partitioned"
        )
        worker = make_worker(policy, settings, secret_env)

        def done(w: Any) -> bool:
            st = w.stats
            return st.published >= published and st.held == 0 and st.consumed == st.accounted

        assert asyncio.run(run_until(worker, done, timeout=60)) == 0
        return worker

    sent = produce(broker.bootstrap, in_topic, waves[1])
    run("a", len(sent))
    changelog = settings_for(broker.bootstrap, unique_name, tmp_path).changelog_topic
    entries = consume_all(broker.bootstrap, changelog)
    victim = next(m for m in entries if m.key and len(m.key) == 34)  # a respondent's state
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    bad = None if damage == "tombstone" else b"\xc1 not a state"
    producer.produce(changelog, bad, victim.key, partition=victim.partition)
    assert producer.flush(30) == 0
    bad_offset = max(m.offset for m in consume_all(broker.bootstrap, changelog)
                     if m.partition == victim.partition)  # fmt: skip

    sent += produce(broker.bootstrap, in_topic, waves[2])
    out_before = len(consume_all(broker.bootstrap, out_topic))
    halted = make_worker(
        policy,
        settings_for(broker.bootstrap, unique_name, tmp_path / "b", state_backend="partitioned"),
        secret_env,
    )
    # it stops by itself: never ready, nothing published
    assert asyncio.run(asyncio.wait_for(serve(halted, install_signals=False), 60)) == 0
    assert isinstance(halted.refused, RestoreError)
    line = str(halted.refused)
    assert f"partition {victim.partition} offset {bad_offset}" in line and "\n" not in line
    assert ("tombstone" if damage == "tombstone" else "does not decode") in line
    assert halted.stats.published == 0
    assert len(consume_all(broker.bootstrap, out_topic)) == out_before

    # the repair: the key's good value produced again supersedes the damage
    producer.produce(changelog, victim.value, victim.key, partition=victim.partition)
    assert producer.flush(30) == 0
    worker = run("c", len(waves[2]))
    assert worker.refused is None
    out = consume_all(broker.bootstrap, out_topic)
    first = {m.headers["record_id"]: m.value or b"" for m in reversed(out)}
    source = {f"{in_topic}/{s.partition}/{s.offset}".encode(): s for s in sent}
    assert set(first) == set(source), "records lost"
    checked = assert_consistent_republication(
        first, source, rr=("occupation", "income"), qis=k_claim()
    )
    assert checked > 300

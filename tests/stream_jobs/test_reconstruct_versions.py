"""`privgw reconstruct --topic` after a rolling policy change (issue 20, item 2).

A real broker topic holds rows of three policy versions: income published with retention 0.75
(two versions that differ elsewhere, so their matrices are pooled), with retention 0.6, and a
fourth version whose metadata record is missing. Each version's rows are reconstructed with
that version's own metadata, read from a custom metadata topic; the combined `<=50K` share
matches the truth within 4 standard errors, where the newest metadata applied to every row
(what the command did before) misses it; the version without metadata is named and skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer

from gateway.engine.engine import Engine
from gateway.engine.records import PublishedRecord, SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.measures.published import mechanisms_from_meta
from gateway.measures.reconstruction import reconstruct
from gateway.policy import Policy, load_policy
from gateway.validation import Validator
from state.memory_store import MemoryStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.delivery.meta import meta_message

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ADULT = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
RETENTION = "rr: {mode: uniform, retention: 0.75}"
K = "  k: 5\n"
assert RETENTION in ADULT and K in ADULT, "the Adult policy changed: update this test"


def _policy(tmp: Path, name: str, text: str) -> Policy:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return load_policy(path)


def _protect(policy: Policy, n: int, seed: int) -> tuple[Engine, list[PublishedRecord], list[str]]:
    """``n`` simulated answers protected by the engine the worker runs; their true incomes."""
    validator = Validator(policy)
    records = []
    survey = PanelSurvey(respondents=n, waves=1, seed=seed, new_share=0.0, rows=load_rows())
    for offset, (key, value) in enumerate(encode(r) for r in survey.records()):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        records.append(ValidRecord(rid, values, SourceRef("in", 0, offset, 1000), 0.0))
    records = records[:n]
    engine = Engine(
        policy, keyring=Keyring(b"reconstruct-test-secret-0123456789"), store=MemoryStore()
    )
    published: list[PublishedRecord] = []
    for start in range(0, len(records), 5000):
        window = records[start : start + 5000]
        published += engine.protect_window(window, now=0.0, flush_all=True).published
    assert len(published) == len(records)
    return engine, published, [str(r.values["income"]) for r in records]


def _send(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes, list]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for key, value, headers in items:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(30) == 0


def test_rows_are_reconstructed_with_their_own_policy_version(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    policies = {
        "a": _policy(tmp_path, "a", ADULT),
        "a6": _policy(tmp_path, "a6", ADULT.replace(K, "  k: 6\n")),
        "b": _policy(tmp_path, "b", ADULT.replace(RETENTION, RETENTION.replace("0.75", "0.6"))),
        "c": _policy(tmp_path, "c", ADULT.replace(RETENTION, RETENTION.replace("0.75", "0.9"))),
    }
    sizes = {"a": 8000, "a6": 4000, "b": 10000, "c": 1000}
    topic, meta_topic = f"{unique_name}.protected", f"{unique_name}.metas"
    versions, metas, truth, rows = {}, {}, [], []
    for seed, (name, policy) in enumerate(policies.items()):
        engine, published, incomes = _protect(policy, sizes[name], seed)
        versions[name], metas[name] = engine.version, engine.metadata()
        if name != "c":
            truth += incomes
        for rec in published:
            header = [("policy_version", engine.version.encode())] if name != "c" else []
            rows.append((rec.key, rec.value, header))  # c: the version is in the value only
    assert len(set(versions.values())) == 4
    _send(broker.bootstrap, topic, rows)
    meta_records = [meta_message(metas[n]) for n in ("a", "a6", "b")]  # b is the newest
    _send(broker.bootstrap, meta_topic, [(key, value, []) for key, value, _ in meta_records])

    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "reconstruct", "--bootstrap", broker.bootstrap,
         "--topic", topic, "--meta-topic", meta_topic, "--json"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    income = orjson.loads(proc.stdout)["income"]

    # the version without metadata: named on stderr and in the report, left out
    assert income["skipped_versions"] == {versions["c"]: sizes["c"]}
    warning = [line for line in proc.stderr.splitlines() if versions["c"] in line]
    assert len(warning) == 1 and "WARNING" in warning[0] and "no metadata" in warning[0]
    # equal matrices pooled (a and a6), the other version on its own
    groups = {tuple(g["policy_versions"]): g["n"] for g in income["groups"]}
    assert groups == {
        tuple(sorted([versions["a"], versions["a6"]])): sizes["a"] + sizes["a6"],
        (versions["b"],): sizes["b"],
    }
    assert income["n"] == len(truth)

    j = income["categories"].index("<=50K")
    share = float(np.mean([t == "<=50K" for t in truth]))
    for method in ("em", "inversion"):
        est, se = income[method][j], income[f"{method}_se"][j]
        assert 0 < se < 0.02
        assert abs(est - share) <= 4 * se, (method, est, share, se)

    # what the command did before: the newest metadata (b, or a) applied to every row
    for name in ("b", "a"):
        mech = mechanisms_from_meta(metas[name])["income"]
        codes = np.array([mech.categories.index(orjson.loads(v)["income"]) for _, v, _ in rows])
        old = reconstruct(mech, codes)
        assert abs(old.em[j] - share) > 4 * old.em_se[j], (name, old.em[j], share)

    # the human-readable report names the matrices' versions too
    text = subprocess.run(
        [sys.executable, "-m", "gateway", "reconstruct", "--bootstrap", broker.bootstrap,
         "--topic", topic, "--meta-topic", meta_topic],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert f"policy versions {versions['b']}" in text.stdout
    assert "income (n = 22000; 2 matrices)" in text.stdout


def test_a_missing_metadata_topic_is_a_clear_error(
    broker: EmbeddedBroker, unique_name: str
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})  # the protected topic exists
    producer.produce(f"{unique_name}.protected", b"{}")
    assert producer.flush(30) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "reconstruct", "--bootstrap", broker.bootstrap,
         "--topic", f"{unique_name}.protected", "--meta-topic", f"{unique_name}.nothing"],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("privgw: error:") and f"{unique_name}.nothing" in proc.stderr
    # issue 45, item 9: it was blamed on --topic, which names a topic that exists
    assert proc.stderr.startswith(f"privgw: error: --meta-topic: topic {unique_name}.nothing")
    assert "--topic:" not in proc.stderr and "output.meta_topic" in proc.stderr

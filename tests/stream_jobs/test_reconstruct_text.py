"""`privgw reconstruct --topic` as text when policy versions publish different categories
(issue 30, item 7): there is no combined estimate then, and each version's table must still
come under its own attribute's header (they came out under the attribute printed before)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_reconstruct_versions import ADULT, ROOT, _policy, _protect, _send

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.delivery.meta import meta_message

pytestmark = [pytest.mark.broker]

INCOME = 'categories: ["<=50K", ">50K"]'


def test_each_attribute_gets_its_header_when_versions_differ_in_categories(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    assert INCOME in ADULT
    policies = [
        _policy(tmp_path, "a", ADULT),
        _policy(tmp_path, "b", ADULT.replace(INCOME, 'categories: ["<=50K", ">50K", "refused"]')),
    ]
    topic, meta_topic = f"{unique_name}.protected", f"{unique_name}.metas"
    rows, metas, versions = [], [], []
    for seed, policy in enumerate(policies):
        engine, published, _ = _protect(policy, 400, seed)
        versions.append(engine.version)
        metas.append(meta_message(engine.metadata()))
        rows += [(r.key, r.value, [("policy_version", engine.version.encode())]) for r in published]
    _send(broker.bootstrap, topic, rows)
    _send(broker.bootstrap, meta_topic, [(key, value, []) for key, value, _ in metas])
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "reconstruct", "--bootstrap", broker.bootstrap,
         "--topic", topic, "--meta-topic", meta_topic],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    headers = {line.split(" (")[0]: i for i, line in enumerate(lines) if not line.startswith(" ")}
    assert set(headers) == {"income", "occupation"}, proc.stdout
    income = headers["income"]
    assert lines[income] == "income (n = 800; 2 matrices):"
    tables = [i for i, line in enumerate(lines) if line.startswith("  policy versions")]
    assert len(tables) == 2 and all(income < i for i in tables), proc.stdout
    end = headers["occupation"] if headers["occupation"] > income else len(lines)
    assert all(i < end for i in tables), "a version's table under another attribute"
    assert any("no combined estimate" in line for line in lines[income:end])

"""The secret's fingerprint and every rotation on the metadata topic (issue 32, item 5; and
issue 30's rotation counter that a restart set back to 0).

The issue's reproduction: a new secret on a fresh state directory changed 63.6 % of randomized
values with no warning — the state that held the old fingerprint was gone — and a rotation left
no marker on the metadata topic.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from streamkit import consume_all, create_input_topic, make_worker, run_until, settings_for

from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.state_store.state_api import SecretMismatchError
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.delivery.meta import is_announcement

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
SECRET_A = "announce-test-secret-A-0123456789abcdef"
SECRET_B = "announce-test-secret-B-fedcba9876543210"


def test_a_changed_secret_is_refused_even_on_a_fresh_state_and_rotations_are_announced(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=1)
    meta_topic = f"{unique_name}.out.meta"

    def worker(secret: str, state: str, **extra: Any) -> Any:
        settings = settings_for(
            broker.bootstrap, unique_name, tmp_path / state, engine="thread", **extra
        )
        return make_worker(policy, settings, secret)

    def run(w: Any) -> None:
        assert asyncio.run(run_until(w, lambda _: True, timeout=30)) == 0

    def announcements() -> list[dict[str, Any]]:
        return [
            orjson.loads(m.value or b"")
            for m in consume_all(broker.bootstrap, meta_topic)
            if is_announcement(m.key)
        ]

    fp_a, fp_b = (Keyring(s.encode()).fingerprint() for s in (SECRET_A, SECRET_B))
    run(worker(SECRET_A, "a"))
    assert [(a["key_fingerprint"], a["rotation"]) for a in announcements()] == [(fp_a, False)]

    refused = worker(SECRET_B, "fresh")  # its state knows nothing: the topic does
    with pytest.raises(SecretMismatchError):
        run(refused)
    assert refused.refused is not None
    message = str(refused.refused)
    assert fp_a in message and fp_b in message and "--rotate-secret" in message
    assert SECRET_A not in message and SECRET_B not in message

    rotated = worker(SECRET_B, "fresh2", rotate_secret=True)
    run(rotated)
    assert rotated.stats.secret_rotations == 1
    assert [(a["key_fingerprint"], a["previous_key_fingerprint"]) for a in announcements()] == [
        (fp_a, None),
        (fp_b, fp_a),
    ]
    again = worker(SECRET_B, "fresh3")  # a restart: the rotation is still counted
    run(again)
    assert again.stats.secret_rotations == 1
    assert len(announcements()) == 2


def test_a_rotation_onto_a_new_metadata_topic_is_announced_as_one(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    """The state's check accepted the rotation (``--rotate-secret``) but the new metadata topic
    had no earlier announcement: it was announced as no rotation, and after a restart the
    counter read 0."""
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=1)
    state = tmp_path / "s"

    def run(secret: str, out: str, **extra: Any) -> Any:
        settings = settings_for(
            broker.bootstrap, unique_name, state, engine="thread", output_topic=out, **extra
        )
        w = make_worker(policy, settings, secret)
        assert asyncio.run(run_until(w, lambda _: True, timeout=30)) == 0
        return w

    run(SECRET_A, f"{unique_name}.out")
    rotated = run(SECRET_B, f"{unique_name}.new", rotate_secret=True)
    assert rotated.stats.secret_rotations == 1
    shown = [
        orjson.loads(m.value or b"")
        for m in consume_all(broker.bootstrap, f"{unique_name}.new.meta")
        if is_announcement(m.key)
    ]
    assert [a["rotation"] for a in shown] == [True]
    assert run(SECRET_B, f"{unique_name}.new").stats.secret_rotations == 1  # after a restart

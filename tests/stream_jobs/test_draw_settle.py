"""The draw derivation of a deployment on the metadata topic and in the state (issue 33,
item 3): a new deployment draws with AES and says so in both; a restart and a lost state keep
it; a state or a topic of the version before derivations were recorded keeps HMAC; a state and
a topic that disagree are refused before anything is published."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from streamkit import (
    accounted,
    consume_all,
    create_input_topic,
    make_worker,
    produce,
    run_until,
    settings_for,
    small_window_policy,
    validated_panel,
)

from gateway.engine.engine import Engine
from gateway.keyed.draw_derivation import META_NAME, DrawDerivation, DrawDerivationError
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from state.changelog import META_ENTRY_PREFIX
from state.layout import SINGLE
from state.rocks_store import RocksStore
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.delivery.meta import is_announcement, meta_message

pytestmark = pytest.mark.broker

SECRET = "draw-settle-test-secret-0123456789abcdef"
AES, HMAC = "aes-256-cbc-mac", "hmac-sha256"


def _recorded(state_dir: Path) -> str | None:
    con = sqlite3.connect(state_dir / SINGLE)
    try:
        row = con.execute("SELECT value FROM privgw_meta WHERE name = ?", (META_NAME,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        con.close()


class Deployment:
    """One deployment's topics on the shared broker; its workers run on given state dirs."""

    def __init__(self, broker: EmbeddedBroker, name: str, tmp: Path) -> None:
        self.broker, self.name, self.tmp = broker, name, tmp
        tmp.mkdir(exist_ok=True)
        self.policy = load_policy(small_window_policy(tmp, 100, pool="window"))
        create_input_topic(broker.bootstrap, f"{name}.in", partitions=1)
        panel = PanelSurvey(respondents=60, waves=2, seed=4, rows=load_rows())
        self.sent = produce(broker.bootstrap, f"{name}.in", map(encode, panel.records()))

    def run(
        self,
        state: str,
        engine: str = "thread",
        *,
        replay: str | None = None,
        restart: bool = False,
        **extra: Any,
    ) -> Any:
        """A worker on ``state`` until every record is accounted for. ``replay``: a lost state
        replayed from the first offset (a group of its own, output to ``<name>.<replay>``,
        the deployment's metadata topic). ``restart``: the group's offsets are committed, so
        it is done once it started (settled, restored and announced)."""
        extra.update(engine=engine, partitions=1)
        if replay is not None:
            extra.update(
                group_id=f"{self.name}-{replay}-g",
                output_topic=f"{self.name}.{replay}",
                meta_topic=f"{self.name}.out.meta",
            )
        settings = settings_for(self.broker.bootstrap, self.name, self.tmp / state, **extra)
        worker = make_worker(self.policy, settings, SECRET)
        done = (lambda _: True) if restart else (lambda w: accounted(w, len(self.sent)))
        assert asyncio.run(run_until(worker, done, timeout=30)) == 0
        return worker

    def drawn(self, topic: str = "out") -> list[tuple[Any, ...]]:
        """The randomized-response values published on ``<name>.<topic>`` with each record's
        wave, sorted: they depend on the keyed draws alone, not on how windows were cut."""
        docs = [
            orjson.loads(m.value or b"")
            for m in consume_all(self.broker.bootstrap, f"{self.name}.{topic}")
        ]
        return sorted(((d["wave"], d["occupation"], d["income"]) for d in docs), key=repr)

    def announced(self) -> list[str | None]:
        """The derivation of each policy record on the metadata topic, oldest first."""
        return [
            orjson.loads(m.value or b"").get(META_NAME)
            for m in consume_all(self.broker.bootstrap, f"{self.name}.out.meta")
            if not is_announcement(m.key)
        ]


def test_a_new_deployment_announces_and_records_aes_and_keeps_it(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    d = Deployment(broker, unique_name, tmp_path)
    first = d.run("a", engine="process")  # the engine in its child: settled over the socket
    assert first.engine.draws.value == AES
    assert d.announced() == [AES]
    assert _recorded(tmp_path / "a") == AES

    restarted = d.run("a", restart=True)
    assert restarted.engine.draws.value == AES and _recorded(tmp_path / "a") == AES
    assert d.announced() == [AES, AES]
    # the state lost: replayed from the first offset, the same randomized values
    lost = d.run("lost", replay="replay")
    assert lost.engine.draws.value == AES and _recorded(tmp_path / "lost") == AES
    assert d.drawn("replay") == d.drawn() and len(d.drawn()) == len(d.sent)


def test_state_and_topic_of_the_previous_version_keep_hmac_and_a_mismatch_is_refused(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    d = Deployment(broker, unique_name, tmp_path)
    # what the previous version left: a state with entries and no derivation recorded (its
    # HMAC draws; test_draw_upgrade.py checks them against that version's own code) ...
    old = tmp_path / "old"
    old.mkdir()
    with SQLiteStore(old / SINGLE) as store:
        engine = Engine(
            d.policy,
            keyring=Keyring(SECRET.encode()),
            store=store,
            draws=DrawDerivation.HMAC_SHA256,
        )
        engine.protect_window(validated_panel(90), now=0.0, flush_all=True)
        legacy_meta = {k: v for k, v in engine.metadata().items() if k != META_NAME}
    con = sqlite3.connect(old / SINGLE)
    with con:
        con.execute("DELETE FROM privgw_meta WHERE name = ?", (META_NAME,))
    con.close()
    assert _recorded(old) is None
    # ... and a metadata record without the field
    key, value, _ = meta_message(legacy_meta)
    produce(broker.bootstrap, f"{unique_name}.out.meta", [(key, value)])

    upgraded = d.run("old", engine="process")
    assert upgraded.engine.draws.value == HMAC
    assert _recorded(old) == HMAC
    assert d.announced()[-1] == HMAC

    # its state lost: the topic keeps the replay on HMAC, so it publishes the same values
    # (with AES, the default of a fresh state, they would differ)
    lost = d.run("lost", replay="replay")
    assert lost.engine.draws.value == HMAC and _recorded(tmp_path / "lost") == HMAC
    assert d.drawn("replay") == d.drawn() and len(d.drawn()) == len(d.sent)

    # the state of a new deployment (AES) with this topic (HMAC): refused, nothing published
    other = Deployment(broker, unique_name + "-b", tmp_path / "b")
    other.run("aes")
    assert _recorded(tmp_path / "b" / "aes") == AES
    before = len(consume_all(broker.bootstrap, f"{unique_name}.out"))
    settings = settings_for(
        broker.bootstrap, unique_name, tmp_path / "b" / "aes", engine="thread", partitions=1
    )
    refused = make_worker(d.policy, settings, SECRET)
    with pytest.raises(DrawDerivationError):
        asyncio.run(run_until(refused, lambda _: True, timeout=30))
    message = str(refused.refused)
    assert AES in message and HMAC in message and "one deployment" in message
    assert len(consume_all(broker.bootstrap, f"{unique_name}.out")) == before
    assert gc.isenabled()  # the refused start gave the process its collector back


def test_partitions_of_the_partitioned_backend_record_it_and_restore_it_with_their_state(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    """The partitioned backend's store records nothing itself: each partition records the
    deployment's derivation when it is assigned, through the changelog, and a partition
    rebuilt from the changelog brings it back (not recorded a second time)."""
    d = Deployment(broker, unique_name, tmp_path)
    first = d.run("p", state_backend="partitioned")
    assert first.engine.draws.value == AES
    with RocksStore(tmp_path / "p" / "partitions" / "partition-0") as part:
        assert part.meta(META_NAME) == AES and part.count() > 0

    lost = d.run("q", state_backend="partitioned", restart=True)  # rebuilt from the changelog
    assert lost.engine.draws.value == AES
    with RocksStore(tmp_path / "q" / "partitions" / "partition-0") as part:
        assert part.meta(META_NAME) == AES and part.count() > 0
    changelog = settings_for(broker.bootstrap, unique_name, tmp_path).changelog_topic
    recorded = [
        m.value
        for m in consume_all(broker.bootstrap, changelog)
        if m.key is not None and m.key.startswith(META_ENTRY_PREFIX)
    ]
    assert recorded == [AES.encode()]

"""Reading operators' wave closes (stream_jobs.intake.wave_control): which records are control
records, and when a close holds for a worker's partitions."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from streamkit import make_worker, settings_for, validated_panel

from gateway.commands.cli import main
from gateway.engine.records import InputMarks, SourceRef, ValidRecord
from gateway.policy import MAX_WAVE, load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.intake.wave_control import HEADER, WAVE_CLOSE, WaveCloses, control_wave
from stream_jobs.windows.window_lifecycle import window_engine

CLOSE = [(HEADER, WAVE_CLOSE)]


def test_only_records_with_the_control_header_are_control_records() -> None:
    assert control_wave(None, b'{"wave": 1}') is None
    assert control_wave([("record_id", b"x")], b'{"wave": 1}') is None
    assert control_wave(CLOSE, b'{"wave": 7}') == 7
    assert control_wave(CLOSE, b'{"wave": %d}' % MAX_WAVE) == MAX_WAVE


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1]",
        b'{"wave": "1"}',
        b'{"wave": -1}',
        b'{"wave": true}',
        b'{"wave": 2147483648}',  # beyond gateway.policy.MAX_WAVE: no record has that wave
        b'{"wave": 1, "respondent_id": "r1", "age": 40}',  # a survey record with the header
    ],
)
def test_a_control_record_that_cannot_be_read_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="wave"):
        control_wave(CLOSE, value)
    with pytest.raises(ValueError, match="unknown control record"):
        control_wave([(HEADER, b"reboot")], b'{"wave": 1}')


def test_a_close_holds_once_every_owned_partition_of_its_topic_has_shown_it() -> None:
    closes = WaveCloses()
    owned = [("in", 0), ("in", 1), ("in.repartition", 0)]
    assert closes.closed_through(owned) is None
    closes.mark("in", 0, 2)
    assert closes.closed_through(owned) is None  # partition 1 may still carry wave 2
    closes.mark("in", 1, 3)
    assert closes.closed_through(owned) == 2  # the oldest close any partition has shown
    closes.mark("in", 0, 1)  # an older close read again (a restart) changes nothing
    assert closes.closed_through(owned) == 2
    assert closes.closed_through([("in", 1)]) == 3  # partition 0 went to another worker


ADULT = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "adult.yaml"
OWNED = [("in", 0), ("in", 1), ("in", 2)]


@pytest.mark.parametrize(("engine", "shards"), [("process", None), ("thread", None), ("thread", 2)])
def test_a_restarted_worker_takes_the_waves_its_state_decided_as_closed(
    tmp_path: Path, secret_env: str, engine: str, shards: int | None
) -> None:
    """Waves 1 and 2 decided and committed, then a restart: nothing of them is read again,
    and the engine's release clock starts empty. A wave-1 record of a new respondent that
    comes then is late, and published at once with its quasi-identifiers suppressed, as
    without a restart — it was held as if wave 1 were open, its offset uncommitted, until
    the next wave closed."""
    policy = load_policy(ADULT)
    settings = settings_for("127.0.0.1:9", "restart", tmp_path, engine=engine, engine_shards=shards)
    records = [r for r in validated_panel(90) if r.values["wave"] in {1, 2}]
    first = make_worker(policy, settings, secret_env)
    assert first.intake.wave_closes.closed_through(OWNED) is None  # a new state decided none
    try:  # an operator's close of wave 2 decides both
        run = window_engine(first.engine).prepare(
            records, now=1.0, marks=InputMarks(dict.fromkeys(OWNED, -1), 2)
        )()
        assert run.held == [] and run.report.published == len(records)
    finally:
        for close in first.closers:
            close()
    again = make_worker(policy, settings, secret_env)
    try:
        closed = again.intake.wave_closes.closed_through(OWNED)  # read from the state
        late = ValidRecord("late-1", {**records[0].values}, SourceRef("in", 0, 500, 2000), 100.0)
        marks = InputMarks({tp: 100 for tp in OWNED}, closed)
        result = window_engine(again.engine).prepare([late], now=100.0, marks=marks)()
        assert result.held == [], "held as if wave 1 were open"
        assert closed == 2
        [published] = result.published
        assert published.suppressed and published.record_id.startswith("1-")
    finally:
        for close in again.closers:
            close()


@pytest.mark.parametrize("wave", ["2147483648", "-1", "1.5", "three"])
def test_wave_close_takes_only_a_wave_number(wave: str, capsys: pytest.CaptureFixture[str]) -> None:
    # checked before any broker is asked (the command line's own error, exit 2)
    policy = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "adult.yaml"
    with pytest.raises(SystemExit) as stopped:
        main(["wave", "close", wave, "--policy", str(policy), "--bootstrap", "127.0.0.1:1"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"must be a wave number, a whole number in [0, {MAX_WAVE}], got '{wave}'" in err


@pytest.mark.broker
def test_wave_close_on_a_missing_topic_is_refused_and_creates_nothing(
    broker: EmbeddedBroker, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Describing a missing topic creates it where the broker auto-creates topics (the
    development broker and Kafka's default): a mistyped --input-topic was created, and the
    close reported done on its empty partitions."""
    policy = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "adult.yaml"
    topic = f"{unique_name}.mistyped"
    args = ["--policy", str(policy), "--bootstrap", broker.bootstrap, "--input-topic", topic]
    assert main(["wave", "close", "1", *args]) == 2
    assert f"input topic {topic} does not exist" in capsys.readouterr().err
    listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert topic not in listed.topics

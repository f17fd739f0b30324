"""A panel survey on Kafka: respondents answer wave after wave, keyed by respondent id.

Answers are rows of UCI Adult (``../shared/data/adult.csv`` when present, else the bundled
2,000-row sample; CC BY 4.0). Wave 1 has ``respondents`` people; in every later wave everyone
answers again, a share (``change_share``, default 5%) changes one answer — a quasi-identifier
or a sensitive value, taken from another real row — and a share (``new_share``) of new
respondents joins. Each record carries ``respondent_id`` (also the Kafka key), ``wave`` and
``submitted_at`` (ISO 8601), with the Adult values as in the CSV (ints for numbers, ``?`` for
missing). Everything is drawn from ``numpy.random.default_rng(seed)``.

:func:`generate_panel` returns the records (the ground truth for tests);
:func:`produce_panel` sends them at a given rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import importlib.resources
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka.errors import KafkaError

from gateway.engine.records import json_bytes
from gateway.errors import InputDataError
from stream_jobs.kafka import make_producer
from stream_jobs.ops.broker_watch import BrokerTiming, BrokerWatch
from stream_jobs.settings import WorkerSettings
from stream_jobs.shutdown import CLIENT_STOP_S, BrokerAway

log = logging.getLogger(__name__)

NUMERIC_COLUMNS = frozenset(
    {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"}
)
ADULT_COLUMNS = NUMERIC_COLUMNS | {
    "workclass",
    "education",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native_country",
    "income",
}
# answers that change between waves: quasi-identifiers and sensitive values
CHANGEABLE = (
    "age",
    "hours_per_week",
    "marital_status",
    "workclass",
    "relationship",
    "occupation",
    "income",
    "capital_gain",
)
START = dt.datetime(2024, 5, 6, 9, 0, tzinfo=dt.UTC)
WAVE_DAYS = 7


def adult_csv_path() -> Path | None:
    """``../shared/data/adult.csv`` next to the working directory or the repository."""
    here = Path(__file__).resolve()
    for candidate in (
        Path.cwd().parent / "shared" / "data" / "adult.csv",
        here.parents[3] / "shared" / "data" / "adult.csv",
    ):
        if candidate.is_file():
            return candidate
    return None


def load_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Adult rows with ints for the numeric columns (the bundled sample if no path)."""
    if path is None:
        path = adult_csv_path()
    if path is None:
        text = (
            importlib.resources.files("stream_jobs")
            .joinpath("data", "adult_sample.csv")
            .read_text(encoding="utf-8")
        )
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            why = "not UTF-8 text" if isinstance(err, UnicodeDecodeError) else err.strerror
            raise InputDataError(f"--data {path}: {why}; give a CSV of Adult's columns") from None
    reader = csv.DictReader(text.splitlines())
    missing = sorted(ADULT_COLUMNS - set(reader.fieldnames or ()))
    if missing:
        raise InputDataError(
            f"--data {path}: no column {', '.join(missing)}; the simulator needs Adult's "
            f"{len(ADULT_COLUMNS)} columns (the header of ../shared/data/adult.csv)"
        )
    rows = []
    for i, r in enumerate(reader, start=1):
        try:
            rows.append({k: int(v) if k in NUMERIC_COLUMNS else v for k, v in r.items()})
        except (TypeError, ValueError):  # the value is never named
            bad = next(k for k in NUMERIC_COLUMNS if not _is_int(r.get(k)))
            raise InputDataError(
                f"--data {path}: column {bad!r} is not a whole number at data row {i}"
            ) from None
    if not rows:
        raise InputDataError(f"--data {path}: the survey data file has no rows")
    return rows


def _is_int(text: str | None) -> bool:
    try:
        int(text or "")
    except ValueError:
        return False
    return True


@dataclass
class PanelSurvey:
    respondents: int = 1000
    waves: int = 3
    change_share: float = 0.05
    new_share: float = 0.05
    seed: int | None = 0
    rows: Sequence[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        """Each bad setting named with the fix, its name first (the CLI adds the --)."""
        for name in ("respondents", "waves"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("change_share", "new_share"):
            share = getattr(self, name)
            if not 0.0 <= share <= 1.0:  # also NaN
                raise ValueError(f"{name} must be a share in [0, 1] (e.g. 0.05), got {share}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be a whole number ≥ 0, got {self.seed}")

    def records(self) -> Iterator[dict[str, Any]]:
        """Records wave by wave; within a wave in random order."""
        rows = self.rows if self.rows is not None else load_rows()
        rng = np.random.default_rng(self.seed)
        answers: dict[str, dict[str, Any]] = {}
        next_id = 0

        def new_respondent() -> str:
            nonlocal next_id
            rid = f"p{next_id:07d}"
            next_id += 1
            answers[rid] = dict(rows[int(rng.integers(len(rows)))])
            return rid

        for _ in range(self.respondents):
            new_respondent()
        for wave in range(1, self.waves + 1):
            if wave > 1:
                ids = list(answers)
                changers = rng.random(len(ids)) < self.change_share
                for rid, change in zip(ids, changers, strict=True):
                    if change:
                        col = CHANGEABLE[int(rng.integers(len(CHANGEABLE)))]
                        donor = rows[int(rng.integers(len(rows)))]
                        answers[rid][col] = donor[col]
                for _ in range(int(rng.binomial(self.respondents, self.new_share))):
                    new_respondent()
            ids = list(answers)
            order = rng.permutation(len(ids))
            offsets = rng.uniform(0, 86_400 * 2, size=len(ids))
            base = START + dt.timedelta(days=WAVE_DAYS * (wave - 1))
            for j in order:
                rid = ids[int(j)]
                submitted = base + dt.timedelta(seconds=float(offsets[int(j)]))
                yield {
                    "respondent_id": rid,
                    **answers[rid],
                    "wave": wave,
                    "submitted_at": submitted.isoformat(timespec="seconds"),
                }


def generate_panel(
    respondents: int = 1000,
    waves: int = 3,
    *,
    seed: int | None = 0,
    change_share: float = 0.05,
    new_share: float = 0.05,
    rows: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """All records of the simulated panel, in production order (the ground truth)."""
    return list(PanelSurvey(respondents, waves, change_share, new_share, seed, rows).records())


def encode(record: dict[str, Any]) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a survey record: keyed by respondent id."""
    return str(record["respondent_id"]).encode(), json_bytes(record)  # held by the thousand


async def produce_panel(
    producer: Any,
    topic: str,
    records: Sequence[dict[str, Any]] | Iterator[dict[str, Any]],
    *,
    rate: float = 0.0,
    stop: asyncio.Event | None = None,
    progress: list[int] | None = None,
) -> int:
    """Send records with an aiokafka producer at ``rate`` records/s (0: as fast as possible);
    waits for every acknowledgement. Returns how many were sent."""
    sent = 0
    futures: list[asyncio.Future[Any]] = []
    t0 = time.monotonic()
    chunk = 500 if rate <= 0 else max(1, int(rate / 20))
    for record in records:
        if stop is not None and stop.is_set():
            break
        key, value = encode(record)
        futures.append(await producer.send(topic, value=value, key=key))
        sent += 1
        if sent % chunk == 0:
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            if len(futures) > 20_000:
                await asyncio.gather(*futures)
                futures.clear()
            if progress is not None:
                progress[0] = sent
    if futures:
        await asyncio.gather(*futures)
    if progress is not None:
        progress[0] = sent
    return sent


async def simulate_to(
    settings: WorkerSettings,
    topic: str,
    records: Iterator[dict[str, Any]],
    *,
    rate: float,
    progress: list[int],
) -> int:
    """``privgw simulate``'s sending: :func:`produce_panel` with a producer of ``settings``,
    the broker probed beside it. The producer alone retries for ever once the broker is gone
    (or ends in NodeNotReadyError); here :class:`BrokerAway` is raised once the broker has
    not answered for the watch's timeout (half the stall timeout: 15 s by default)."""
    watch = BrokerWatch(
        BrokerTiming.for_stall_timeout(
            settings.stall_timeout_seconds, settings.lag_interval_seconds
        )
    )
    producer = make_producer(settings)
    await producer.start()
    sending = asyncio.create_task(
        produce_panel(producer, topic, records, rate=rate, progress=progress)
    )
    try:
        while not (await asyncio.wait({sending}, timeout=watch.timing.interval))[0]:
            try:
                await asyncio.wait_for(producer.client.fetch_all_metadata(), watch.timing.timeout)
                watch.answered()
            except (TimeoutError, KafkaError):
                if not watch.reachable():
                    raise BrokerAway from None
        return sending.result()
    finally:
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending
        with contextlib.suppress(KafkaError, TimeoutError):  # nothing to flush to: let go
            await asyncio.wait_for(producer.stop(), CLIENT_STOP_S)


def parse_rate(text: str) -> float:
    """'500/s', '500' or '0' (as fast as possible) → records per second."""
    value = text.strip().removesuffix("/s")
    rate = float(value)
    if rate < 0:
        raise ValueError("rate must be ≥ 0 records/s")
    return rate


def poison_corpus(good: dict[str, Any]) -> list[tuple[str, bytes | None, bytes | None]]:
    """One bad record of each class the gateway must dead-letter, derived from a valid survey
    record of the Adult policy: (expected DLQ reason, key, value). For tests and benches."""
    key = str(good["respondent_id"]).encode()
    raw = orjson.dumps(good)

    def with_(**kw: object) -> bytes:
        return orjson.dumps({**good, **kw})

    deep: object = "x"
    for _ in range(70):
        deep = [deep]
    return [
        ("invalid_json", key, b'{"respondent_id": "p1", "age": '),
        ("invalid_utf8", key, b'{"respondent_id": "\xff\xfe"}'),
        ("wrong_type", key, with_(age="forty")),
        ("missing_field", key, orjson.dumps({k: v for k, v in good.items() if k != "sex"})),
        ("extra_field", key, with_(favourite_colour="blue")),  # the policy: extra_fields error
        ("unknown_category", key, with_(race="Martian")),
        ("out_of_range", key, with_(age=131)),
        # valid local times with no UTC instant: converting them (coarsen to an hour) overflowed
        ("out_of_range", key, with_(submitted_at="9999-12-31T23:00:00-01:00")),
        ("out_of_range", key, with_(submitted_at="0001-01-01T00:30:00+01:00")),
        ("non_finite", key, raw.replace(b'"age":', b'"age":NaN,"_":', 1)),
        ("non_finite", key, raw.replace(b'"age":', b'"age":Infinity,"_":', 1)),
        ("integer_too_large", key, with_(age=2**53 + 1)),
        # a wave the state cannot hold (int32) failed its window on every worker; 1.5 became 1
        ("out_of_range", key, with_(wave=2**31)),
        ("out_of_range", key, with_(wave=-1)),
        ("wrong_type", key, with_(wave=1.5)),
        ("too_large", key, with_(submitted_at="x" * 1_100_000)),
        ("too_deep", key, with_(submitted_at=deep)),
        ("empty_message", key, b""),
        ("not_an_object", key, b"[1, 2, 3]"),
        ("missing_key", None, raw),
        ("duplicate_key", key, raw.replace(b"{", b'{"age":500,', 1)),  # orjson keeps the 39
        ("duplicate_key", key, raw.replace(b"{", b'{"respondent_id":"someone-else",', 1)),
        ("key_mismatch", b"someone-else", raw),  # the state would live on another partition
    ]

"""``privgw demo``: embedded broker + survey simulator + gateway, with a live summary.

Runs entirely on loopback with no external service, prints one summary line per second, and
leaves the protected records in ``<data-dir>/protected-<time>.jsonl``. If no deployment secret
is configured it creates ``<data-dir>/secret.key`` and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

import orjson

from gateway.errors import PrivgwError
from gateway.keyed import SECRET_ENV, SECRET_FILE_ENV, Keyring, generate_secret_file, load_secret
from gateway.policy import Policy, load_policy
from stream_jobs.app import serve
from stream_jobs.broker import EmbeddedBroker
from stream_jobs.cli import build_worker
from stream_jobs.kafka import ensure_topics, make_producer
from stream_jobs.settings import WorkerSettings
from stream_jobs.simulator import PanelSurvey, load_rows, parse_rate, produce_panel
from stream_jobs.topic_reader import read_protected_async
from stream_jobs.worker import GatewayWorker

REPO_POLICY = Path("deploy") / "policies" / "adult.yaml"


def _policy(path: str | None) -> tuple[Policy, str]:
    if path is not None:
        return load_policy(path), path
    if REPO_POLICY.is_file():
        return load_policy(REPO_POLICY), str(REPO_POLICY)
    import importlib.resources  # noqa: PLC0415

    bundled = importlib.resources.files("stream_jobs").joinpath("data", "adult.yaml")
    from gateway.policy import policy_from_yaml  # noqa: PLC0415

    return policy_from_yaml(bundled.read_text(encoding="utf-8")), "bundled adult.yaml"


def _secret(data_dir: Path) -> bytes:
    if os.environ.get(SECRET_ENV) or os.environ.get(SECRET_FILE_ENV):
        return load_secret(os.environ)
    path = data_dir / "secret.key"
    if not path.exists():
        generate_secret_file(path)
        print(f"created a new secret in {path} (no {SECRET_ENV} / {SECRET_FILE_ENV} was set)")
    else:
        print(f"using the demo secret in {path}")
    print(f"  to reuse it with privgw run: export {SECRET_FILE_ENV}={path.resolve()}")
    return load_secret({SECRET_FILE_ENV: str(path)})


def _epsilons(worker: GatewayWorker) -> str:
    rr = worker.engine.metadata().get("randomized_response", {})
    parts = []
    for name, d in rr.items() if isinstance(rr, dict) else ():
        eps = d.get("epsilon")
        parts.append(f"{name}={eps:.2f}" if isinstance(eps, int | float) else f"{name}=∞")
    return " ".join(parts)


def summary_line(worker: GatewayWorker, elapsed: float, sent: int) -> str:
    st = worker.stats
    k = worker.policy.microaggregation.k
    m = st.measures
    smallest = "-" if st.min_group_size is None else str(st.min_group_size)
    line = (
        f"[{elapsed:5.1f}s] sent {sent:>6}  in {st.consumed:>6}  out {st.published:>6}  "
        f"dlq {st.dlq_total:>3}  held {st.held:>3}  suppressed {st.suppressed:>3}  "
        f"windows {st.windows:>3}  smallest group {smallest} (k={k})"
    )
    if "sse_sst_pct" in m:
        line += f"  SSE/SST {m['sse_sst_pct']:.2f}%"
    if "dld" in m:
        line += f"  DLD {m['dld']:.3f}"
    return line


def _quiet_libraries() -> None:
    """The demo's console is its summary: the clients' INFO chatter (joins, assignments,
    service start/stop) would bury it. Warnings and errors still show."""
    for name in ("aiokafka", "faust", "mode", "stream_jobs"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_demo(
    *,
    records: int = 20_000,
    data_dir: Path = Path("privgw-data"),
    policy_path: str | None = None,
    rate: str = "5000",
    waves: int = 4,
    seed: int = 0,
) -> int:
    if records < 1:
        raise PrivgwError("--records must be ≥ 1")
    try:
        per_second = parse_rate(rate)
    except ValueError:
        raise PrivgwError(f"--rate must be records per second like 5000, got {rate}") from None
    data_dir.mkdir(parents=True, exist_ok=True)
    _quiet_libraries()
    policy, policy_name = _policy(policy_path)
    keyring = Keyring(_secret(data_dir))
    # A fresh state per demo run: the embedded broker forgets everything when it stops.
    state_dir = data_dir / "demo-state"
    for leftover in state_dir.glob("state*.db*"):
        leftover.unlink()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path = data_dir / f"protected-{stamp}.jsonl"
    print(f"policy {policy_name} (version {policy.version}); {records} records, {waves} waves")
    with EmbeddedBroker(log_dir=data_dir) as broker:
        print(f"embedded broker on {broker.bootstrap} (memory only)")
        settings = WorkerSettings(
            bootstrap=broker.bootstrap,
            group_id="privgw-demo",
            partitions=3,
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
            state_dir=state_dir,
            metrics_port=0,
            flush_held_on_shutdown=True,  # the demo ends: suppress what still waits for k
            shutdown_grace_seconds=20,
        )
        try:
            return asyncio.run(
                _demo(
                    policy=policy,
                    settings=settings,
                    keyring=keyring,
                    records=records,
                    rate=per_second,
                    waves=waves,
                    seed=seed,
                    out_path=out_path,
                    policy_name=policy_name,
                )
            )
        except KeyboardInterrupt:
            print("interrupted")
            return 130


async def _demo(
    *,
    policy: Policy,
    settings: WorkerSettings,
    keyring: Keyring,
    records: int,
    rate: float,
    waves: int,
    seed: int,
    out_path: Path,
    policy_name: str,
) -> int:
    topics = settings.topics(policy)
    await ensure_topics(settings, topics, input_too=True)
    worker: GatewayWorker = build_worker(policy, settings, keyring)
    respondents = max(1, records // max(1, waves))
    survey = PanelSurvey(respondents=respondents, waves=waves + 1, seed=seed, rows=load_rows())
    stream = (r for _, r in zip(range(records), survey.records(), strict=False))
    stop = asyncio.Event()
    sent = [0]
    t0 = time.monotonic()

    async def simulate() -> None:
        await worker.ready.wait()
        producer = make_producer(settings)
        await producer.start()
        try:
            await produce_panel(producer, topics.input, stream, rate=rate, stop=stop, progress=sent)
        finally:
            await producer.stop()

    async def watch() -> None:
        print(f"gateway starting (epsilon per attribute: {_epsilons(worker)})")
        last = 0.0
        while not stop.is_set():
            await asyncio.sleep(0.1)
            st = worker.stats
            done = st.consumed >= records and st.consumed == st.accounted
            now = time.monotonic()
            if now - last >= 1.0 or done:
                print(summary_line(worker, now - t0, sent[0]), flush=True)
                last = now
            if done:
                stop.set()

    sim = asyncio.create_task(simulate())
    watcher = asyncio.create_task(watch())
    try:
        code = await serve(worker, stop=stop)
    finally:
        stop.set()
        for task in (sim, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    print(summary_line(worker, time.monotonic() - t0, sent[0]))
    meta, rows = await read_protected_async(settings.bootstrap, topics.output, quiet=0.5)
    with out_path.open("wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")
    meta_path = out_path.with_name(out_path.name + ".meta.json")
    meta_path.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    st = worker.stats
    print(
        f"done in {time.monotonic() - t0:.1f} s: {st.consumed} in, {st.published} published "
        f"({st.suppressed} with quasi-identifiers suppressed), {st.dlq_total} dead-lettered"
    )
    print(f"protected records: {out_path} ({len(rows)} lines); metadata: {meta_path}")
    print(f"estimate distributions: privgw reconstruct {out_path} --policy {policy_name}")
    return code

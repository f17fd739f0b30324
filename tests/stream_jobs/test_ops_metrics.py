"""The operational figures of stream_jobs/ops/ops_metrics.py (issue 30): the engine's child
processes' CPU and memory (`process_*` is the worker's process only, while the default engine
does most of its work in a child), the state disk's room, and policy upgrades with every
action present, read from real processes and a real file system."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TEST_SECRET
from prometheus_client import CollectorRegistry, generate_latest

from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from stream_jobs.commands.cli import build_worker
from stream_jobs.ops.ops_metrics import OperationsCollector, engine_pids, process_usage
from stream_jobs.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def _samples(worker: object) -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    OperationsCollector(worker, None).register(registry)  # type: ignore[arg-type]
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("shards", [1, 2])
def test_the_engine_processes_cpu_and_memory_are_exported(tmp_path: Path, shards: int) -> None:
    settings = WorkerSettings(
        state_dir=tmp_path, metrics_port=0, engine="process", engine_shards=shards
    )
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    worker = build_worker(policy, settings, Keyring(TEST_SECRET.encode()))
    try:
        pids = engine_pids(worker.engine)
        assert len(pids) == shards and os.getpid() not in pids
        samples = _samples(worker)
        for shard in range(shards):
            cpu = samples[f'privgw_engine_cpu_seconds_total{{shard="{shard}"}}']
            rss = samples[f'privgw_engine_resident_memory_bytes{{shard="{shard}"}}']
            assert cpu > 0  # the child imported numpy, built the engine
            assert rss > 30e6  # a Python with numpy and pandas loaded
        st = os.statvfs(tmp_path)
        assert samples["privgw_state_disk_size_bytes"] == st.f_blocks * st.f_frsize
        assert 0 < samples["privgw_state_disk_free_bytes"] <= st.f_blocks * st.f_frsize
        for action in ("safe", "regroup", "fresh_draws"):
            assert samples[f'privgw_policy_upgrades_total{{action="{action}"}}'] == 0
    finally:
        for close in worker.closers:
            close()
    for pid in pids:  # gone (and reaped) with the worker: nothing to read for them
        assert process_usage(pid) is None


def test_a_thread_engine_has_no_child_to_report(tmp_path: Path) -> None:
    settings = WorkerSettings(state_dir=tmp_path, metrics_port=0, engine="thread")
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    worker = build_worker(policy, settings, Keyring(TEST_SECRET.encode()))
    try:
        assert engine_pids(worker.engine) == []
        assert not [k for k in _samples(worker) if k.startswith("privgw_engine_cpu_seconds")]
    finally:
        for close in worker.closers:
            close()

"""Operational figures beside the gateway's own (stream_jobs.ops.metrics): is the broker answering,
what do the engine's processes use, how much room is left for the state.

* ``privgw_broker_reachable`` (1/0) and ``privgw_broker_silent_seconds``: the monitor's
  metadata probe (stream_jobs.ops.broker_watch), independent of traffic;
* ``privgw_engine_cpu_seconds_total{shard}`` and ``privgw_engine_resident_memory_bytes{shard}``:
  the engine's child processes (``process_*`` covers the worker's own process only; with the
  default engine process most of the CPU is the child's), read from ``/proc`` on Linux;
* ``privgw_state_disk_free_bytes`` and ``privgw_state_disk_size_bytes``: the file system that
  holds the state directory, for an alert before it is full (a full disk stops the worker);
* ``privgw_policy_upgrades_total{action}``: policy upgrades applied to the state
  (state.policy_record), persisted with it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.policy.upgrade import UpgradeAction
from stream_jobs.ops.monitor import Monitor
from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def engine_pids(engine: Any) -> list[int]:
    """The engine's child processes, one per shard (none: the engine runs in the worker)."""
    pids = getattr(engine, "pids", None)
    if pids is not None:
        return list(pids)
    pid = getattr(engine, "pid", None)
    return [pid] if isinstance(pid, int) else []


def process_usage(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, user + system; resident bytes) of a process from /proc; None when it
    is gone or /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces: the fields after it follow its closing parenthesis
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime, rss_pages = int(fields[11]), int(fields[12]), int(fields[21])
    return (utime + stime) / _TICKS, rss_pages * _PAGE


class OperationsCollector(Collector):
    """The figures of the module docstring, read at scrape time."""

    def __init__(self, worker: GatewayWorker, monitor: Monitor | None, prefix: str = "privgw"):
        self._worker = worker
        self._monitor = monitor
        self._prefix = prefix

    def register(self, registry: CollectorRegistry) -> OperationsCollector:
        registry.register(self)
        return self

    def collect(self) -> Iterator[Any]:
        # one part failing must not fail the scrape (the gateway's own figures come with it)
        for part in (self._broker, self._engine, self._disk, self._upgrades):
            try:
                yield from part()
            except Exception as err:
                log.warning("%s not exported: %s", part.__name__, err.__class__.__name__)

    def _broker(self) -> Iterator[Any]:
        p = self._prefix
        if self._monitor is not None:
            broker = self._monitor.broker
            yield GaugeMetricFamily(
                f"{p}_broker_reachable",
                "1 while the broker answers the monitor's metadata probes (independent of "
                "traffic); 0 after half the stall timeout without an answer",
                value=1 if broker.reachable() else 0,
            )
            yield GaugeMetricFamily(
                f"{p}_broker_silent_seconds",
                "seconds since the broker last answered a metadata probe",
                value=broker.silent_for(),
            )

    def _upgrades(self) -> Iterator[Any]:
        p = self._prefix
        upgrades = CounterMetricFamily(
            f"{p}_policy_upgrades",
            "policy upgrades applied to this worker's state, by action (safe, regroup, "
            "fresh_draws: a privacy event); kept with the state, so they survive restarts",
            labels=["action"],
        )
        counts = getattr(self._worker, "policy_events", {})
        for action in UpgradeAction:  # every action, 0 included: the alerts need the series
            upgrades.add_metric([action.value], counts.get(action.value, 0))
        yield upgrades

    def _engine(self) -> Iterator[Any]:
        p = self._prefix
        cpu = CounterMetricFamily(
            f"{p}_engine_cpu",
            "CPU seconds (user + system) of each engine process",
            labels=["shard"],
            unit="seconds",
        )
        rss = GaugeMetricFamily(
            f"{p}_engine_resident_memory_bytes",
            "resident memory of each engine process",
            labels=["shard"],
        )
        for shard, pid in enumerate(engine_pids(self._worker.engine)):
            usage = process_usage(pid)
            if usage is not None:
                cpu.add_metric([str(shard)], usage[0])
                rss.add_metric([str(shard)], usage[1])
        yield cpu
        yield rss

    def _disk(self) -> Iterator[Any]:
        p = self._prefix
        try:
            st = os.statvfs(self._worker.settings.state_dir)
        except OSError as err:  # gone or unreadable: said by the worker's own failure
            log.debug("state disk not measured: %s", err.__class__.__name__)
            return
        yield GaugeMetricFamily(
            f"{p}_state_disk_free_bytes",
            "bytes available to the worker on the file system of the state directory",
            value=st.f_bavail * st.f_frsize,
        )
        yield GaugeMetricFamily(
            f"{p}_state_disk_size_bytes",
            "size of the file system of the state directory",
            value=st.f_blocks * st.f_frsize,
        )

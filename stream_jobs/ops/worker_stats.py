"""The worker's running totals, read by its live summary, the metrics exporter and the monitor
(no personal data: counts, timings, DLQ reasons, topic partitions)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gateway.engine.records import WindowReport


@dataclass(slots=True)
class WorkerStats:
    """Running totals for the live summary and the metrics exporter (no personal data)."""

    consumed: int = 0
    valid: int = 0
    published: int = 0
    # records published for no consumed record: a panel's absent members (and re-sent ones)
    imputed: int = 0
    withheld: int = 0  # consumed records decided, not published (WindowReport.withheld)
    suppressed: int = 0
    dlq: Counter[str] = field(default_factory=Counter)
    windows: int = 0
    held: int = 0
    groups: int = 0
    min_group_size: int | None = None
    sticky_hits: int = 0
    commits: int = 0
    retries: int = 0  # re-sent windows and retried commits while the broker was away
    repartitioned: int = 0  # keyless input records forwarded, keyed, to the repartition topic
    control: int = 0  # operators' control records read (stream_jobs.intake.wave_control)
    flush_seconds: float = 0.0
    last_report: WindowReport | None = None
    measures: dict[str, float] = field(default_factory=dict)
    # (topic, partition) -> records behind the partition's high watermark after the last fetch
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    restore_remaining: int = 0  # changelog records still to replay (partitioned state)
    secret_rotations: int = 0  # states accepted with another key fingerprint (--rotate-secret)
    # liveness (stream_jobs.ops.monitor, read from other threads): time.monotonic() of the loop's
    # last turn, of the hand-over of the window now in the engine (None: none is), and whether
    # the last produce and commit went through
    loop_tick: float = 0.0
    engine_since: float | None = None
    broker_ok: bool = True
    # the engine's heartbeat (stream_jobs.engine_process.engine_heartbeat): since when one waits for
    # its answer (None: none does), and why the engine process is gone (None: it is not)
    heartbeat_since: float | None = None
    engine_gone: str | None = None

    @property
    def dlq_total(self) -> int:
        return sum(self.dlq.values())

    @property
    def accounted(self) -> int:
        """Consumed records whose fate is known: published, withheld, dead-lettered, held,
        forwarded, or an operator's control record."""
        counted = self.published + self.withheld + self.dlq_total + self.held
        return counted + self.repartitioned + self.control

"""Operating a worker: Prometheus metrics and their HTTP endpoint, the monitor (liveness,
readiness, lag), the worker's running totals, and its logs."""

"""`privgw run`'s checks before it starts anything (issue 45, item 5): every one of them
passes before anything is written to the state directory, so a refused start — a wrong
secret against the metadata topic, a policy change, a broker that is not there — leaves a new
state directory as it was, and the fixed start then runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.errors import PrivgwError
from stream_jobs.worker_build import require_rocksdb


def start_checks(policy: Any, settings: Any, topics: Any, keyring: Any) -> Any:
    """The user's mistakes first, each in one line, before any process or client starts;
    nothing is written to the state directory until every check has passed (a refused start
    leaves a new one as it was). Returns the policy check (recorded, or migrated)."""
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from state.failures import check_state_dir  # noqa: PLC0415
    from stream_jobs.commands.upgrade_cli import check_policy_on_state  # noqa: PLC0415
    from stream_jobs.kafka import check_bootstrap, check_input_topic  # noqa: PLC0415
    from stream_jobs.ops.metrics import check_metrics_port  # noqa: PLC0415
    from stream_jobs.topic_configs import check_topic_configs  # noqa: PLC0415

    if settings.state_backend == "partitioned":
        require_rocksdb()
    state_dir = Path(settings.state_dir)
    check_state_dir(state_dir, create=False)  # path and condition named (state.failures)
    check_policy_on_state(policy, settings, dry_run=True)  # a changed policy: refused
    check_metrics_port(settings)
    asyncio.run(check_bootstrap(settings))
    try:  # exit 2 before any engine starts
        asyncio.run(check_input_topic(settings, topics))
        asyncio.run(check_topic_configs(settings, topics, policy.longest_wait))
        asyncio.run(check_announced(policy, settings, topics, keyring))
    except KafkaError as err:
        raise PrivgwError(
            f"cannot reach Kafka at {settings.bootstrap} ({err.__class__.__name__}): check "
            "--bootstrap / PRIVGW_BOOTSTRAP and the PRIVGW_SECURITY_PROTOCOL settings"
        ) from None
    check_state_dir(state_dir)  # created if new
    return check_policy_on_state(policy, settings)  # recorded, or migrated


async def check_announced(policy: Any, settings: Any, topics: Any, keyring: Any) -> None:
    """The secret and the state's draw derivation against the metadata topic, read only."""
    from gateway.keyed.draw_derivation import META_NAME  # noqa: PLC0415
    from gateway.policy import ConsistencyMode  # noqa: PLC0415
    from state.policy_record import peek_meta  # noqa: PLC0415
    from stream_jobs.secret.secret_announce import check_before_writing  # noqa: PLC0415

    keyed = policy.consistency.mode is ConsistencyMode.STICKY
    draws = peek_meta(Path(settings.state_dir), META_NAME) if keyed else None
    await check_before_writing(settings, topics.meta, keyring.fingerprint(), draws)

"""``privgw offsets show`` and ``privgw offsets reset``: a consumer group and a state directory's
offsets side by side, and the group taken back to the state's (issue 45, item 7).

A state directory restored from a backup (the sqlite backend) has processed its partitions up
to the offsets its ledger records (``partitions.json``,
:mod:`stream_jobs.partitions.partition_state`); the group committed further. ``reset`` commits the
ledger's offsets for the group (with every worker of the group stopped: the broker refuses a commit
from outside a group with members) and records in the ledger, per partition, the offset the group
had committed: the records in between are protected again at the next start, their outputs marked
``supersedes: true``. No Kafka tooling is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from gateway.commands.command_kit import add_command
from gateway.errors import PrivgwError


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "offsets",
        "a consumer group's committed offsets against a state directory's (the sqlite backend)",
        "privgw offsets reset --state-dir /var/lib/privgw/state --group-id privgw",
    )
    actions = p.add_subparsers(dest="offsets_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "show",
        "per input partition: the offset the state has processed and the group's commit",
        "privgw offsets show --state-dir /var/lib/privgw/state --group-id privgw",
    )
    _options(p)
    p.set_defaults(func=cmd_offsets_show)
    p = add_command(
        actions,
        "reset",
        "take the group back to the state's offsets (after a restore from a backup; every "
        "worker of the group stopped): the records after them are protected again, marked "
        "superseding. --dry-run says what it would do",
        "privgw offsets reset --state-dir /var/lib/privgw/state --group-id privgw --dry-run",
    )
    _options(p)
    p.add_argument("--dry-run", action="store_true", help="report, change nothing")
    p.set_defaults(func=cmd_offsets_reset)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="the worker's state directory (PRIVGW_STATE_DIR)")
    p.add_argument("--group-id", help="the worker's consumer group (PRIVGW_GROUP_ID)")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (PRIVGW_BOOTSTRAP)")


Row = tuple[tuple[str, int], int, int | None]  # (topic, partition), state's offset, group's


async def _rows(settings: Any, ledger: Any) -> list[Row]:
    from aiokafka import TopicPartition  # noqa: PLC0415

    from stream_jobs.kafka import make_consumer  # noqa: PLC0415

    consumer = make_consumer(settings)
    await consumer.start()
    try:
        rows: list[Row] = []
        for (topic, p), offset in sorted(ledger.offsets.items()):
            committed = await consumer.committed(TopicPartition(topic, p))
            rows.append(((topic, p), offset, None if committed is None else int(committed)))
        return rows
    finally:
        await consumer.stop()


def _open(args: argparse.Namespace) -> tuple[Any, Any]:
    from state.failures import check_existing_state_dir  # noqa: PLC0415
    from stream_jobs.kafka import check_bootstrap  # noqa: PLC0415
    from stream_jobs.partitions.partition_state import PartitionLedger  # noqa: PLC0415
    from stream_jobs.worker_build import worker_settings  # noqa: PLC0415

    settings = worker_settings(
        state_dir=args.state_dir, group_id=args.group_id, bootstrap=args.bootstrap
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # its INFO lines broke the table
    state_dir = Path(settings.state_dir)
    check_existing_state_dir(state_dir)
    ledger = PartitionLedger(state_dir)
    if not ledger.existed:
        raise PrivgwError(
            f"--state-dir {state_dir} has no partition ledger (partitions.json): give the "
            "directory of a sqlite-backend worker that has processed records (the partitioned "
            "backend's state follows its changelog, not the group's offsets)"
        )
    asyncio.run(check_bootstrap(settings))
    return settings, ledger


def _table(rows: list[Row]) -> None:
    print(f"{'partition':<40} {'state':>12} {'group':>12}  behind the group")
    for (topic, p), offset, committed in rows:
        gap = "" if committed is None or committed <= offset else f"{committed - offset}"
        shown = "-" if committed is None else str(committed)
        print(f"{f'{topic}/{p}':<40} {offset:>12} {shown:>12}  {gap}")


def cmd_offsets_show(args: argparse.Namespace) -> int:
    settings, ledger = _open(args)
    rows = asyncio.run(_rows(settings, ledger))
    print(f"group {settings.group_id}, state {settings.state_dir}")
    _table(rows)
    return 0


def cmd_offsets_reset(args: argparse.Namespace) -> int:
    settings, ledger = _open(args)
    rows = asyncio.run(_rows(settings, ledger))
    ahead = {tp: (offset, committed) for tp, offset, committed in rows
             if committed is not None and committed > offset}  # fmt: skip
    print(f"group {settings.group_id}, state {settings.state_dir}")
    _table(rows)
    if not ahead:
        print("nothing to reset: the group has committed nothing beyond the state's offsets")
        return 0
    records = sum(c - o for o, c in ahead.values())
    if args.dry_run:
        print(f"would reset {len(ahead)} partitions: {records} records protected again")
        return 0
    # the ledger first: a reset interrupted after it leaves the range marked, and a second
    # run finds the group as it was or reset; a reset the group refuses unmarks it
    before = dict(ledger.republish)
    for tp, (_, committed) in ahead.items():
        ledger.republish[tp] = max(committed, ledger.republish.get(tp, 0))
    ledger.write()
    try:
        asyncio.run(_commit(settings, {tp: o for tp, (o, _) in ahead.items()}, ledger.state_id))
    except PrivgwError:
        ledger.republish = before
        ledger.write()
        raise
    print(
        f"reset {len(ahead)} partitions of group {settings.group_id} to the state's offsets: "
        f"{records} records are protected again at the next start, their outputs marked with "
        "the header supersedes: true (a consumer keeps the last copy of each record_id)"
    )
    return 0


async def _commit(settings: Any, offsets: dict[tuple[str, int], int], state_id: str) -> None:
    from aiokafka import TopicPartition  # noqa: PLC0415
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from stream_jobs.kafka import make_consumer  # noqa: PLC0415
    from stream_jobs.partitions.partition_state import COMMIT_TAG  # noqa: PLC0415

    consumer = make_consumer(settings)
    await consumer.start()
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # a refused commit is our one line, not six of its own
    try:
        tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit({tp: (o, COMMIT_TAG + state_id) for tp, o in tps.items()})
    except KafkaError as err:
        raise PrivgwError(
            f"the group {settings.group_id} refused the reset ({err.__class__.__name__}): stop "
            "every worker of the group first (a running member owns its commits), then run "
            "it again"
        ) from None
    finally:
        quiet.setLevel(level)
        await consumer.stop()

"""What the worker's least work costs: the passthrough against a loop that only validates.

    .venv/bin/python bench/worker_floor.py                  # 200,000 records, 3 alternating pairs
    .venv/bin/python bench/worker_floor.py --pairs 5

Both sides read the same simulated panel from one input topic of the development broker, as
``bench/stream_throughput.py`` does, and alternate:

* passthrough: ``stream_throughput.passthrough``, the records copied unchanged;
* validate and re-encode: the same loop (``passthrough(encode=...)``), each record validated
  against the Adult policy (``gateway.validation``) and its values encoded again as the worker
  encodes its outputs (``json_bytes``), with the headers privgw's output records carry (record
  id, policy version, window id). No engine, no windows, no keys, no state: every privgw worker
  does at least this much a record.

Printed per side: records/s, and CPU µs a record of this process and of the broker. The ratio of
the validating loop to the passthrough in the same pair is what the target of
``stream_throughput`` (privgw >= 0.5x the passthrough) has left for the protection itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from aiokafka import ConsumerRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_throughput as st

from gateway.engine.records import json_bytes
from gateway.policy import policy_from_yaml
from gateway.validation import Rejection, Validator
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows


def validate_and_reencode(validator: Validator) -> st.Encode:
    """What the copy of a record carries when it is validated and re-encoded as privgw does."""
    validate = validator.decode_and_validate
    version, window = b"bench", b"window-1"

    def copy_of(m: ConsumerRecord[bytes, bytes]) -> tuple[bytes, list[tuple[str, bytes]]]:
        res = validate(m.value, m.key)
        if isinstance(res, Rejection):
            raise SystemExit(f"the panel's record at offset {m.offset} was refused")
        rid, values = res
        headers = [
            ("record_id", (rid or "").encode()),
            ("policy_version", version),
            ("window_id", window),
        ]
        return json_bytes(values), headers  # as the worker encodes its outputs

    return copy_of


async def main_async(args: argparse.Namespace) -> None:
    survey = PanelSurvey(respondents=args.records // 3, waves=3, seed=1, rows=load_rows())
    records = [encode(r) for r in survey.records()][: args.records]
    n = len(records)
    validator = Validator(policy_from_yaml(st.policy_text(False)))
    print(f"{n} records, {args.pairs} alternating pairs")
    ratios: list[float] = []
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap
        await st.bench_topics(bs, "floor.in", "floor.out")
        await st.preload(bs, "floor.in", records, close_waves=False)
        for i in range(args.pairs):
            rate: dict[str, float] = {}
            sides = ("passthrough", "validate") if i % 2 == 0 else ("validate", "passthrough")
            for side in sides:
                dst, group = f"floor.{side}{i}.out", f"floor-{side}{i}"
                await st.bench_topics(bs, "floor.in", dst)
                copy = None if side == "passthrough" else validate_and_reencode(validator)
                t = await st.passthrough(
                    bs, "floor.in", dst, n, group, broker_pid=broker.pid, encode=copy
                )
                rate[side] = n / t.seconds
                print(
                    f"pair {i + 1}: {side:11} {rate[side]:>9,.0f} rec/s   CPU µs a record: "
                    f"this process {t.cpu / n * 1e6:.1f}, broker {t.broker_cpu / n * 1e6:.1f}"
                )
            ratios.append(rate["validate"] / rate["passthrough"])
            print(f"        validate and re-encode / passthrough: {ratios[-1]:.2f}")
    print(f"median ratio over {len(ratios)} pairs: {statistics.median(ratios):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--pairs", type=int, default=3)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()

"""What a panel's state weighs: the roster's bytes by field, after the engine has fed the
simulated Adult panel of bench/stream_throughput.py the way bench/engine_ab.py feeds it (windows
of 5,000, each wave's close with its last record), and the respondent entries beside it.

    .venv/bin/python bench/roster_bytes.py                  # 90,000 records, the tree
    .venv/bin/python bench/roster_bytes.py --revision b9e7fdb  # draws still in respondent entries

The roster is read back whole (from its parts when it is in parts) and each field of its
document re-encoded alone; the sealed carried values count as their ciphertext. The draws' line
is per drawing attribute: its pairs, its distinct publications and its bytes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_ab as ab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=90_000)
    ap.add_argument("--revision", default=None, help="git revision (default: the working tree)")
    args = ap.parse_args()
    answers = ab.panel_answers(args.records, ab.stream_throughput.policy_text(False))
    with tempfile.TemporaryDirectory(prefix="privgw-roster-") as tmp:
        answer, engine, store, blobs = ab.prepare_own(args.revision, Path(tmp), answers, "s.db")
        closes, marks_for, kept = ab.closed_through(answers, len(blobs)), ab.marks_of("head"), 0
        for w, blob in enumerate(blobs):
            ask = ("protect", [blob], w * 0.1, w == len(blobs) - 1, marks_for(closes[w]), kept)
            kept = ab.report_of(answer(ask, engine, store, False)).held
        items = dict(store.items())
        store.close()
    roster = importlib.import_module("head_gateway.panel.roster")
    key = roster.roster_key(None)
    head = msgspec.msgpack.decode(items[key])
    body = items[key]
    if "parts" in head:
        parts = [roster.roster_part_key(key, head["slot"], i) for i in range(head["parts"])]
        body = b"".join(msgspec.msgpack.decode(items[p])["b"] for p in parts)
    doc = msgspec.msgpack.decode(body)
    members = int(doc["size"])
    print(f"{args.records:,} records: roster of {members:,} members, {len(body):,} bytes "
          f"({len(body) / members:.0f} a member)")  # fmt: skip
    sizes = {field: len(msgspec.msgpack.encode(value)) for field, value in doc.items()}
    for field, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        if size > 16:
            print(f"  {field:<8} {size:>12,} bytes  {size / members:7.1f} a member")
    for col in doc.get("draws", {}).get("cols", ()):
        print(f"  draws of {col[0]} {col[1]}: {len(col[3]) // 8:,} pairs, {len(col[5])} distinct "
              f"publications, {len(msgspec.msgpack.encode(col)):,} bytes")  # fmt: skip
    entries = [v for k, v in items.items() if not k.startswith(b"group:")]
    print(f"respondent entries: {len(entries):,}, {sum(map(len, entries)) + 32 * len(entries):,} "
          "bytes with their keys")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

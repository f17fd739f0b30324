"""What a keyed draw costs under each derivation, and what that does to the engine: one run.

    .venv/bin/python bench/keyed_draws.py                        # draws, then the engine
    .venv/bin/python bench/keyed_draws.py --records 0            # the draws only

1. Draws: ``KeyedSource.uniform`` under ``hmac-sha256`` (one pre-keyed HMAC-SHA256 per draw)
   and ``aes-256-cbc-mac`` (a batch CBC-MAC under an HKDF key per purpose: a few AES-ECB calls
   over every key of the batch at once; ``gateway.keyed.draw_derivation``), on keys of 48 bytes
   (respondent key + value digest, as sticky randomized response draws them), in batches of a
   window's size; the rounds alternate the two so a drift of the shared machine hits both.
2. The engine alone on the Adult policy (bench/stream_throughput.py's, the whole-key claim):
   the engine process's work on a window (``stream_jobs.engine_process.engine_process``: packed
   window decoded, ``Engine.protect_window`` with SQLite state, result packed), one engine per
   derivation, each its own state file, their windows alternating (order swapped every window
   and round), as bench/engine_ab.py does for two versions.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_throughput  # the bench's policies

from gateway.engine.keyed_inputs import KeyedInputs
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.draw_derivation import DrawDerivation
from gateway.keyed.keyed import KeyedSource, Keyring
from gateway.policy import policy_from_yaml
from gateway.validation import Validator
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.engine_process import engine_process

SECRET = b"bench-secret-0123456789"
WINDOW = 5000
DERIVATIONS = (DrawDerivation.HMAC_SHA256, DrawDerivation.AES_CBC_MAC)


def draws(batch: int, batches: int, rounds: int) -> None:
    keys = [os.urandom(48) for _ in range(batch)]
    sources = {d: KeyedSource(Keyring(SECRET), d) for d in DERIVATIONS}
    for s in sources.values():
        s.uniform("rr/occupation", batch, keys)  # the cipher built, caches warm
    spent = dict.fromkeys(DERIVATIONS, 0.0)
    for rnd in range(rounds):
        for d in DERIVATIONS if rnd % 2 == 0 else DERIVATIONS[::-1]:
            t0 = time.perf_counter()
            for _ in range(batches):
                sources[d].uniform("rr/occupation", batch, keys)
            spent[d] += time.perf_counter() - t0
    n = batch * batches * rounds
    for d in DERIVATIONS:
        print(f"draws {d.value:16s} {n / spent[d]:>12,.0f} draws/s  {spent[d] / n * 1e6:.3f} µs")
    hmac_s, aes_s = (spent[d] for d in DERIVATIONS)
    print(f"draws aes / hmac: {hmac_s / aes_s:.1f}x the draws a second")


def engine(records: int, rounds: int) -> None:
    text = stream_throughput.policy_text(False)
    policy = policy_from_yaml(text)
    survey = PanelSurvey(respondents=records // 3, waves=3, seed=1, rows=load_rows())
    raw = [encode(r) for r in survey.records()][:records]
    validator = Validator(policy)
    valid = []
    for i, (key, value) in enumerate(raw):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        valid.append(ValidRecord(rid, values, SourceRef("in", i % 3, i, 0), 0.0))
    # packed as the worker packs them, keyed digests included (untimed: the worker's time)
    pack = functools.partial(
        engine_process._encode_window, inputs=KeyedInputs(policy, Keyring(SECRET))
    )
    blobs = [pack(valid[s : s + WINDOW]) for s in range(0, len(valid), WINDOW)]
    starts = range(0, len(valid), WINDOW)
    phase = [0 if s < len(valid) // 3 else 1 for s in starts]  # wave 1, waves 2-3
    counted = [0, 0]
    for s, p in zip(starts, phase, strict=True):
        counted[p] += min(WINDOW, len(valid) - s) * rounds
    spent = {d: [0.0, 0.0] for d in DERIVATIONS}
    with tempfile.TemporaryDirectory(prefix="privgw-draws-") as tmp:
        for rnd in range(rounds):
            runs: dict[DrawDerivation, tuple[Any, Any]] = {}
            for d in DERIVATIONS:
                spec = engine_process.EngineSpec(policy, Path(tmp) / f"{d.value}{rnd}.db", SECRET)
                eng, store = spec.build()
                eng.use_draws(d)  # a fresh state: either derivation may be chosen
                runs[d] = (eng, store)
            gc.disable()  # collected between windows, as the engine process does
            try:
                for w, blob in enumerate(blobs):
                    for d in DERIVATIONS if (w + rnd) % 2 == 0 else DERIVATIONS[::-1]:
                        eng, store = runs[d]
                        t0 = time.perf_counter()
                        engine_process._answer(("protect", [blob], 0.0, True), eng, store, False)
                        spent[d][phase[w]] += time.perf_counter() - t0
                        gc.collect(0)
            finally:
                gc.enable()
                for eng, store in runs.values():
                    assert eng.draws_bound() is eng.draws  # recorded: it drew with that one
                    store.close()
    n1, n23 = counted
    for d in DERIVATIONS:
        w1, w23 = spent[d]
        print(
            f"engine {d.value:16s} wave 1 {w1 / n1 * 1e6:.1f} µs a record, waves 2-3 "
            f"{w23 / n23 * 1e6:.1f}, all {(w1 + w23) / (n1 + n23) * 1e6:.1f} "
            f"({(n1 + n23) / (w1 + w23):,.0f} rec/s)"
        )
    (h1, h23), (a1, a23) = (spent[d] for d in DERIVATIONS)
    print(
        f"engine aes / hmac time: wave 1 {a1 / h1:.3f}, waves 2-3 {a23 / h23:.3f}, "
        f"all {(a1 + a23) / (h1 + h23):.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=WINDOW, help="draws a batch (a window's)")
    ap.add_argument("--batches", type=int, default=40, help="batches a round")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds of draws")
    ap.add_argument("--records", type=int, default=60_000, help="engine records (0: none)")
    ap.add_argument("--engine-rounds", type=int, default=2, help="fresh states each round")
    args = ap.parse_args()
    draws(args.batch, args.batches, args.rounds)
    if args.records:
        engine(args.records, args.engine_rounds)


if __name__ == "__main__":
    main()

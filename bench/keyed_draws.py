"""What a keyed draw costs: privgw's HMAC-SHA256 draws against a batch AES PRF, in one run.

    .venv/bin/python bench/keyed_draws.py                 # 5,000 draws a batch, 50 batches
    .venv/bin/pip install cryptography                     # to time the AES side too

A sticky value is drawn once per (respondent, attribute, true value): ``KeyedSource.uniform``
takes the top 53 bits of HMAC-SHA256(secret, purpose + key) for each key (one pre-keyed
``hashlib`` copy, update and digest pair per draw). The alternative the throughput issue names
is a vectorised PRF: here a CBC-MAC with AES-256 over the fixed-length messages of a batch (the
purpose block, then the 48-byte key = respondent key + value digest as three blocks), one ECB
call per block position over every message at once, chained with numpy XORs. It is timed only,
not used: the draw derivation is part of the replay guarantee (DESIGN §5), see
docs/streaming.md, "Measured and not adopted".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.keyed import KeyedSource, Keyring

_BLOCK = 16
_SCALE53 = 2.0**-53


def aes_batch_draws(n: int) -> Callable[[list[bytes]], NDArray[np.float64]] | None:
    """A CBC-MAC-with-AES draw over keys of 48 bytes, or None without ``cryptography``."""
    try:
        from cryptography.hazmat.primitives.ciphers import (  # noqa: PLC0415 - optional
            Cipher,
            algorithms,
            modes,
        )
    except ImportError:
        return None
    encryptor = Cipher(algorithms.AES(os.urandom(32)), modes.ECB()).encryptor()
    purpose = np.frombuffer(os.urandom(_BLOCK), dtype=np.uint8)

    def draws(keys: list[bytes]) -> NDArray[np.float64]:
        blocks = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, 3, _BLOCK)
        state = np.ascontiguousarray(np.broadcast_to(purpose, (n, _BLOCK)))
        state = np.frombuffer(encryptor.update(state.tobytes()), dtype=np.uint8)
        for j in range(3):
            chained = (state.reshape(n, _BLOCK) ^ blocks[:, j]).tobytes()
            state = np.frombuffer(encryptor.update(chained), dtype=np.uint8)
        top = state.reshape(n, _BLOCK)[:, :8].copy().view(">u8").ravel() >> np.uint64(11)
        return top.astype(np.float64) * _SCALE53

    return draws


def per_draw_us(draw: Callable[[list[bytes]], object], keys: list[bytes], batches: int) -> float:
    t0 = time.perf_counter()
    for _ in range(batches):
        draw(keys)
    return 1e6 * (time.perf_counter() - t0) / batches / len(keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=5000, help="draws a batch (a window's)")
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    args = ap.parse_args()
    keys = [os.urandom(48) for _ in range(args.batch)]
    source = KeyedSource(Keyring(b"bench-secret-0123456789"))

    def hmac_draws(batch: list[bytes]) -> NDArray[np.float64]:
        return source.uniform("noise/capital_gain/1", len(batch), batch)

    aes = aes_batch_draws(args.batch)
    if aes is None:
        print("cryptography is not installed: timing the HMAC draws only")
    for round_ in range(args.repeat):  # interleaved: drift in machine load hits both
        hmac_us = per_draw_us(hmac_draws, keys, args.batches)
        line = f"round {round_ + 1}: HMAC-SHA256 {hmac_us:.3f} µs a draw"
        if aes is not None:
            aes_us = per_draw_us(aes, keys, args.batches)
            line += f"   AES batch {aes_us:.3f} µs a draw   ({hmac_us / aes_us:.1f}x)"
        print(line)


if __name__ == "__main__":
    main()

"""What a secret must be before the gateway keys anything with it.

A secret file readable by group or others leaks the key of every pseudonym and draw to any
local account; a secret of repeated or few distinct bytes (16 spaces, 16 zero bytes) can be
guessed. Both are refused at start with the fix named. Platforms that mount secrets readable by
all (some container runtimes) may opt in with ``PRIVGW_SECRET_FILE_SHARED=1``: then a WARNING
says so at every start.
"""

from __future__ import annotations

import logging
import math
import os
import stat
from collections import Counter
from collections.abc import Mapping

from gateway.errors import PrivgwError

log = logging.getLogger(__name__)

SHARED_FILE_ENV = "PRIVGW_SECRET_FILE_SHARED"
# bits estimated from the secret's own byte frequencies (a lower bound for a random secret of
# that alphabet is not what this is: it catches the degenerate ones). 32 random bytes, hex
# encoded, estimate ~250 bits; 16 random hex digits ~54; 16 spaces 0.
MIN_ESTIMATED_BITS = 48.0


def estimated_bits(secret: bytes) -> float:
    """len × the Shannon entropy of the secret's byte frequencies."""
    if not secret:
        return 0.0
    n = len(secret)
    return sum(c * math.log2(n / c) for c in Counter(secret).values())  # ≥ 0: no "-0 bits"


def check_secret_strength(secret: bytes, source: str, error: type[PrivgwError]) -> None:
    bits = estimated_bits(secret)
    if bits < MIN_ESTIMATED_BITS:
        raise error(
            f"the secret from {source} has too little entropy (about {bits:.0f} bits "
            f"estimated from its bytes; need {MIN_ESTIMATED_BITS:.0f}): it can be guessed. "
            "Create a random one with `privgw secret create FILE`"
        )


def check_secret_file_mode(path: str, environ: Mapping[str, str], error: type[PrivgwError]) -> None:
    """Refuse a secret file that group or others may read (or write), unless opted in."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return  # reading it reports the problem
    if not mode & 0o077:
        return
    if environ.get(SHARED_FILE_ENV, "") in {"1", "true", "yes"}:
        log.warning(
            "the secret file %s is readable by group or others (mode %03o); accepted because "
            "%s is set",
            path,
            mode,
            SHARED_FILE_ENV,
        )
        return
    raise error(
        f"PRIVGW_SECRET_FILE {path} is readable by group or others (mode {mode:03o}): any local "
        f"account could read the key of every pseudonym and draw. Run chmod 600 {path}, or set "
        f"{SHARED_FILE_ENV}=1 where the platform can only mount secrets that way"
    )

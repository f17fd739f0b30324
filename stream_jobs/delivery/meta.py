"""The metadata topic ``<output>.meta``: compacted, key = policy version, value = JSON.

It carries ``Engine.metadata()`` — k, methods, and per randomized attribute the categories,
matrix P, γ, ε and retention — everything an analyst needs to reconstruct distributions from
the protected topic. Published (and acknowledged) before the first protected record.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson


def meta_message(metadata: Mapping[str, object]) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the metadata record."""
    version = str(metadata["policy_version"])
    value = orjson.dumps(dict(metadata), option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return version.encode(), value, [("policy_version", version.encode())]


def parse_meta(value: bytes) -> dict[str, object]:
    meta = orjson.loads(value)
    if not isinstance(meta, dict) or "policy_version" not in meta:
        raise ValueError("not a privgw metadata record")
    return meta


# key fingerprint announcements share the topic (stream_jobs.secret.secret_announce): not a policy's
ANNOUNCEMENT_PREFIX = b"privgw/key-fingerprint/"


def is_announcement(key: bytes | None) -> bool:
    return key is not None and key.startswith(ANNOUNCEMENT_PREFIX)

"""Randomized response on a published column: each true category replaced by a draw from its
column of the matrix P (:class:`~gateway.mechanisms.randomized_response.RRMechanism`, which
carries γ and ε), sticky per (respondent, true value), each value stamped with the version of
the matrix it was drawn under (:mod:`gateway.mechanisms.stamp`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import orjson
from numpy.typing import NDArray

from gateway.mechanisms.protection import Draws, Protection, Published
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.rr_constructions import from_spec
from gateway.policy import MISSING_LABEL, Attribute


def matrix_version(mech: RRMechanism) -> str:
    """The mechanism's version, as the metadata topic and each stamped value name it."""
    return hashlib.sha256(orjson.dumps(mech.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()[
        :12
    ]


@dataclass(frozen=True, eq=False)
class RandomizedResponse(Protection):
    name: str
    mechanism: RRMechanism
    kind: ClassVar[str | None] = "rr"
    version: str = field(init=False)
    codes: Mapping[str, int] = field(init=False, repr=False)  # category -> its row of P
    # the codes with None as the missing label's (-1 without one): a column looked up in C
    _lookup: Mapping[object, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", matrix_version(self.mechanism))
        codes = {c: i for i, c in enumerate(self.mechanism.categories)}
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "_lookup", {**codes, None: codes.get(MISSING_LABEL, -1)})

    @property
    def cost(self) -> RRMechanism:
        return self.mechanism

    def release(self) -> dict[str, object]:
        return {"randomized_response": {**self.mechanism.to_dict(), "matrix_version": self.version}}

    def apply(self, values: list[Any], draws: Draws) -> Published:
        """The published values, sticky hits, retention, and the matrix version each value
        was drawn under (a stored draw keeps the version it was drawn with)."""
        name, codes_of = self.name, self.codes
        code_list = self._codes(values)
        codes = np.array(code_list, dtype=np.int64)
        out: list[Any]
        hits = 0
        vds = draws.digests(name)
        rand = draws.rand
        if draws.view.sticky and vds is not None:
            found, fresh, hits, fresh_keys = draws.recall(
                "rr", name, vds, [code >= 0 for code in code_list]
            )
            out = [None if f is None else f[0] for f in found]
            under: list[str | None] = [
                None if f is None else (f[1] if len(f) > 1 else None) for f in found
            ]
            u = rand.uniform(f"rr/{name}", len(fresh), fresh_keys) if fresh else np.empty(0)
        else:
            vds = []
            out = [None] * len(values)
            under = [None] * len(values)
            fresh = [i for i, code in enumerate(code_list) if code >= 0]
            u = rand.uniform(f"rr/{name}", len(fresh)) if fresh else np.empty(0)
        if fresh:
            mech, current = self.mechanism, self.version
            categories = mech.categories
            labels = [categories[c] for c in mech.apply(codes[fresh], u).tolist()]
            drawn = [None if label == MISSING_LABEL else label for label in labels]
            for i, label in zip(fresh, drawn, strict=True):
                out[i] = label
                under[i] = current
            draws.keep("rr", name, digests=vds, fresh=fresh, drawn=drawn, version=current)
        return Published(out, hits, kept_share(codes_of, codes, out), under)

    def _codes(self, values: Sequence[object]) -> list[int]:
        """Each value's category code (a missing value: the missing label's, else -1)."""
        try:  # validated values are the categories' strings: looked up in C
            return list(map(self._lookup.__getitem__, values))
        except (KeyError, TypeError):  # another type of value, as its text
            missing_code, codes_of = self._lookup[None], self.codes
            return [missing_code if v is None else codes_of[str(v)] for v in values]

    def retention(
        self, values: Sequence[object], published: Sequence[Any]
    ) -> tuple[float, int] | None:
        codes = np.array(self._codes(values), dtype=np.int64)
        return kept_share(self.codes, codes, published)


def kept_share(
    codes_of: Mapping[str, int], codes: NDArray[np.int64], out: Sequence[Any]
) -> tuple[float, int] | None:
    """Randomized response's retention: the share of the randomized records published as their
    true category (an unknown label: not kept), and how many were randomized."""
    published = np.array(
        [codes_of.get(MISSING_LABEL if o is None else o, -2) for o in out], dtype=np.int64
    )
    randomized = codes >= 0
    n = int(randomized.sum())
    return (float(np.mean(published[randomized] == codes[randomized])), n) if n else None


def build(name: str, attr: Attribute, frequencies: Mapping[str, float] | None) -> Protection:
    """From the attribute's ``rr`` settings over its domain (fine-grain: weighted by the
    given frequencies, unless the policy gives weights)."""
    return RandomizedResponse(name, from_spec(attr, frequencies, name=name))

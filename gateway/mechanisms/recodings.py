"""The deterministic recodings of a published column — top/bottom coding, generalization up a
hierarchy, coarsening of timestamps, rounding of a weight, keep — each a function of the value
alone: no draws, nothing stored, no privacy cost of their own to publish beyond their
settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.mechanisms import masking
from gateway.mechanisms.protection import Draws, Protection, Published, finite, finite_list
from gateway.policy import Attribute, CodingSpec, HierarchySpec, TimeUnit


@dataclass(frozen=True)
class TopBottomCode(Protection):
    name: str
    coding: CodingSpec

    def release(self) -> dict[str, object]:
        return {"top_bottom_coding": self.coding.model_dump(mode="json", exclude_none=True)}

    def apply(self, values: list[Any], draws: Draws) -> Published:
        arr = np.array(values, dtype=np.float64)  # None -> nan
        coded = masking.top_bottom_code(arr, self.coding)
        return Published(
            [None if v is None else finite(c) for v, c in zip(values, coded, strict=True)]
        )


@dataclass(frozen=True)
class Generalize(Protection):
    name: str
    hierarchy: HierarchySpec

    def apply(self, values: list[Any], draws: Draws) -> Published:
        return Published(masking.generalize(_text(values), self.hierarchy))


@dataclass(frozen=True)
class Coarsen(Protection):
    name: str
    unit: TimeUnit

    def apply(self, values: list[Any], draws: Draws) -> Published:
        return Published(masking.coarsen(_text(values), self.unit))


@dataclass(frozen=True)
class RoundTo(Protection):
    """A weight published as a multiple of ``step``."""

    name: str
    step: float

    def release(self) -> dict[str, object]:
        return {"round_to": self.step}

    def apply(self, values: list[Any], draws: Draws) -> Published:
        arr = np.array([np.nan if v is None else float(v) for v in values])
        return Published(finite_list(masking.round_to(arr, self.step)))


@dataclass(frozen=True)
class Keep(Protection):
    name: str

    def apply(self, values: list[Any], draws: Draws) -> Published:
        return Published(values)


def _text(values: list[Any]) -> list[str | None]:
    if None not in values:
        return list(map(str, values))
    return [None if v is None else str(v) for v in values]


def top_bottom_code(name: str, attr: Attribute, _: Mapping[str, float] | None) -> Protection:
    assert attr.coding is not None  # the policy requires the coding settings
    return TopBottomCode(name, attr.coding)


def generalize(name: str, attr: Attribute, _: Mapping[str, float] | None) -> Protection:
    assert attr.hierarchy is not None
    return Generalize(name, attr.hierarchy)


def coarsen(name: str, attr: Attribute, _: Mapping[str, float] | None) -> Protection:
    assert attr.coarsen is not None
    return Coarsen(name, attr.coarsen.unit)


def keep(name: str, attr: Attribute, _: Mapping[str, float] | None) -> Protection:
    """Kept as given; a weight with ``round_to`` is rounded to its step."""
    return Keep(name) if attr.round_to is None else RoundTo(name, attr.round_to)

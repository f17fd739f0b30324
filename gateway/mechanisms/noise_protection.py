"""Noise on a published number: x + sd·z (after top/bottom coding, if the policy codes it),
rounded to the policy's step if it gives one, sticky per (respondent, true value). Its cost
is its settings: sd is the larger of ``noise.sd`` and √ratio times the window's standard
deviation (:func:`gateway.mechanisms.masking.noise_sd`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gateway.keyed.randomness import normals_from_uniforms
from gateway.mechanisms import masking
from gateway.mechanisms.protection import Draws, Protection, Published, finite_list
from gateway.policy import Attribute, CodingSpec, NoiseSpec


@dataclass(frozen=True)
class Noise(Protection):
    name: str
    spec: NoiseSpec
    coding: CodingSpec | None = None  # applied first
    step: float | None = None  # round_to, after the noise
    kind: ClassVar[str | None] = "noise"

    @property
    def cost(self) -> NoiseSpec:
        return self.spec

    def release(self) -> dict[str, object]:
        out: dict[str, object] = {"noise": self.spec.model_dump(mode="json", exclude_none=True)}
        if self.coding is not None:
            out["top_bottom_coding"] = self.coding.model_dump(mode="json", exclude_none=True)
        if self.step is not None:
            out["round_to"] = self.step
        return out

    def apply(self, values: list[Any], draws: Draws) -> Published:
        name, rand = self.name, draws.rand
        arr = np.array(values, dtype=np.float64)  # (None: NaN)
        if self.coding is not None:  # top/bottom coding first, then noise on the coded values
            arr = masking.top_bottom_code(arr, self.coding)
        sd = masking.noise_sd(arr, self.spec)
        if sd <= 0.0:
            # nothing to scale the noise by (one value, no noise.sd): publish nothing rather
            # than the true value
            return Published([None] * len(values))
        out: list[Any]
        hits = 0
        vds = draws.digests(name)
        if draws.view.sticky and vds is not None:
            found, fresh, hits, fresh_keys = draws.recall(
                "noise", name, vds, [v is not None for v in values]
            )
            out = found
            u1 = rand.uniform(f"noise/{name}/1", len(fresh), fresh_keys)
            u2 = rand.uniform(f"noise/{name}/2", len(fresh), fresh_keys)
        else:
            vds = []
            out = [None] * len(values)
            fresh = [i for i, v in enumerate(values) if v is not None]
            u1 = rand.uniform(f"noise/{name}/1", len(fresh))
            u2 = rand.uniform(f"noise/{name}/2", len(fresh))
        step = self.step
        if step is not None and hits:  # stored before the policy rounded: idempotent
            kept = np.array(out, dtype=np.float64)  # (None: NaN)
            out = finite_list(masking.round_to(kept, step))
        if fresh:
            noisy = masking.add_noise(arr[fresh], sd, normals_from_uniforms(u1, u2))
            if step is not None:  # after the noise: the stored value is the published one
                noisy = masking.round_to(noisy, step)
            drawn = finite_list(noisy)
            for i, v in zip(fresh, drawn, strict=True):
                out[i] = v
            draws.keep("noise", name, digests=vds, fresh=fresh, drawn=drawn)
        return Published(out, hits, noise_sd=sd)


def build(name: str, attr: Attribute, frequencies: Mapping[str, float] | None) -> Protection:
    assert attr.noise is not None  # the policy requires the noise settings
    return Noise(name, attr.noise, attr.coding, attr.round_to)

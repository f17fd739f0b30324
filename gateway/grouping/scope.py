"""What the stream's grouping takes beside the k claim: strata and l-diversity.

A window's new groups are formed per *scope*: (input partition or none, stratum, release). No
group crosses a stratum, in any republication mode, in partition scope and in every engine
shard (each forms its groups within its own). A respondent's stratum is digested with its
claim tuple, so one who changes stratum has changed its tuple and moves; a group's registry
entry (``regroup``, ``cohort``) and a respondent's current group (``deferred``) keep the keyed
digest of their stratum, never its values.

l-diversity is enforced on the *published* values of the named sensitive attribute: what an
intruder who places a respondent in a class learns is the set of values the class publishes,
so that set must hold l distinct values (a value published as missing counts as one, as the
intruder sees it). The engine therefore takes that attribute's published values before it
groups (sticky draws are keyed: a held record's value now is the one it publishes later).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.errors import PolicyError
from gateway.grouping.l_diversity import diversify
from gateway.grouping.mixed_microaggregation import QIColumn, embed
from gateway.policy import (
    ConsistencyMode,
    GroupingPool,
    MicroaggAlgorithm,
    Policy,
    Pseudonym,
    RepublicationMode,
    SmallStrata,
)


@dataclass(frozen=True, slots=True)
class GroupingInputs:
    """A window's grouping inputs beside the claim, one entry per record."""

    strata: list[str] | None  # stratum as text (the scope key); None: the policy has none
    stratum_digests: list[str] | None  # keyed, what the state keeps; None without a keyring
    sensitive: list[Any] | None  # published l-diversity value; None: not enforced


def refuse_in_stream(policy: Policy) -> None:
    """Raise for a grouping setting the stream engine cannot honour (never ignore one)."""
    spec = policy.microaggregation
    if spec.strata and spec.small_strata is SmallStrata.MERGE:
        raise PolicyError(
            "microaggregation.small_strata merge pools the strata that end below k, which a "
            "stream cannot know (a stratum small in one window may reach k in the next); set "
            "small_strata: suppress for the stream engine: a stratum's records wait for k like "
            "any pool, up to window.max_hold_seconds, then follow window.on_hold_timeout"
        )
    if policy.republication.mode is RepublicationMode.PANEL and (
        spec.strata or spec.l_diversity is not None
    ):
        raise PolicyError(
            "republication.mode panel does not form cohorts within strata or l-diverse yet: "
            "remove microaggregation.strata and l_diversity, or choose the cohort mode"
        )
    if spec.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS:
        refuse_recoding(policy)


def refuse_recoding(policy: Policy) -> None:
    """``recode_suppress`` in the stream decides a wave whole, when it closes, against the
    masks its respondents published before (:mod:`gateway.grouping.recode_stream`)."""
    rep, algo = policy.republication, "microaggregation.algorithm recode_suppress"
    if policy.consistency.mode is not ConsistencyMode.STICKY:
        raise PolicyError(
            f"{algo} in the stream needs consistency.mode sticky (an unchanged respondent's "
            "suppressed cells stay suppressed); set consistency.mode: sticky"
        )
    if rep.pool is not GroupingPool.RELEASE or rep.wave_attribute is None:
        raise PolicyError(
            f"{algo} in the stream needs republication.pool: release with a "
            "republication.wave_attribute: a wave's exact classes are known only once it "
            "closes (pool: window, or a window per release, would publish classes before the "
            "wave's other records are in); set both"
        )
    if rep.mode is not RepublicationMode.REGROUP or rep.slack:
        raise PolicyError(
            f"republication.mode {rep.mode.value} / slack {rep.slack} do not apply to {algo} "
            "(its classes are the exact recoded tuples of each wave, not groups); remove them"
        )


def same_stratum(current: Sequence[Any], strata: Sequence[str] | None, i: int) -> bool:
    """Whether record ``i`` is in the stratum of its current group (``current``: its state's
    entry, which names the stratum's digest third since the policy has strata): one that
    changed stratum cannot stay in its group, not even to keep it at k live members."""
    return strata is None or (len(current) > 2 and current[2] == strata[i])


@dataclass(frozen=True, slots=True)
class Diversifier:
    """Merges one pool's groups until each holds ``ell`` distinct published values, nearest
    centroids first in the claim's embedded space (None: the pool holds fewer; it waits)."""

    columns: Sequence[QIColumn]
    standardize: bool
    ell: int

    def __call__(
        self, rows: list[list[object]], labels: NDArray[np.int64], values: Sequence[Hashable]
    ) -> NDArray[np.int64] | None:
        embedded = embed(self.columns, rows, standardize=self.standardize)
        return diversify(labels, values, embedded, self.ell)


NO_CONSISTENCY = (
    "consistency.mode none gives every release fresh randomness, which an averaging adversary "
    "defeats: the stream, which republishes, refuses it (a file is one release, and privgw "
    "protect runs it); set consistency: {mode: sticky}"
)


def stream_refusal(policy: Policy) -> str | None:
    """Why ``privgw run`` refuses ``policy`` (None: it runs it), for check-policy to say
    before a worker starts; a file command may still run it (one release, no state)."""
    try:
        refuse_in_stream(policy)
    except PolicyError as err:
        return str(err)
    return NO_CONSISTENCY if policy.consistency.mode is ConsistencyMode.NONE else None


def refuse_engine(policy: Policy, secret: bool, store: bool, inconsistent: bool) -> None:
    """An engine the policy and its parts cannot give: say which setting and the fix."""
    refuse_in_stream(policy)
    if policy.consistency.mode is ConsistencyMode.NONE and not inconsistent:
        raise PolicyError(NO_CONSISTENCY)
    if store and not secret:
        raise PolicyError("a state store needs a keyring: set PRIVGW_SECRET or PRIVGW_SECRET_FILE")
    if policy.output.pseudonym is Pseudonym.HMAC and not secret:
        raise PolicyError("output.pseudonym hmac needs a secret: set PRIVGW_SECRET")

"""The policy's vocabulary: roles, types, methods and modes, as enums (never strings)."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    IDENTIFIER = "identifier"
    QUASI_IDENTIFIER = "quasi_identifier"
    SENSITIVE = "sensitive"
    OTHER = "other"  # carried through unchanged (wave number, timestamps)
    WEIGHT = "weight"  # the sampling weight: never a key, weights Fk, risk and estimates


class AttrType(StrEnum):
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"
    TIMESTAMP = "timestamp"  # ISO 8601 text; never published verbatim


class Method(StrEnum):
    DROP = "drop"
    KEEP = "keep"
    MICROAGGREGATION = "microaggregation"
    NOISE = "noise"
    TOP_BOTTOM_CODE = "top_bottom_code"
    GENERALIZE = "generalize"
    RANDOMIZED_RESPONSE = "randomized_response"
    COARSEN = "coarsen"  # timestamps: truncated to the policy's unit


class TimeUnit(StrEnum):
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"  # the Monday that starts the ISO week
    MONTH = "month"


class RRMode(StrEnum):
    UNIFORM = "uniform"
    FINE_GRAIN = "fine_grain"
    MATRIX = "matrix"
    # invariant PRAM (Kooiman, Willenborg & Gouweleeuw 1997): a uniform P of the given
    # strength, then R = Q·P with Q its Bayes reverse under the reference distribution π
    # (rr.weights, else the file's frequencies, else equal), so that R·π = π
    INVARIANT = "invariant"


class MissingHandling(StrEnum):
    KEEP = "keep"  # published as missing, not perturbed
    CATEGORY = "category"  # an extra category, perturbed like the others


class MicroaggAlgorithm(StrEnum):
    MDAV = "mdav"
    RANKING = "ranking"  # univariate individual ranking
    # global recoding (hierarchies, bins) then local suppression to k: no wrong values, some
    # missing ones (sdcMicro's globalRecode + kAnon); the file workflow
    # (gateway/grouping/recode_suppress)
    RECODE_SUPPRESS = "recode_suppress"


class HoldTimeout(StrEnum):
    SUPPRESS = "suppress"
    HOLD = "hold"


class Pseudonym(StrEnum):
    DROP = "drop"
    HMAC = "hmac"


class ExtraFields(StrEnum):
    ERROR = "error"
    IGNORE = "ignore"


class ConsistencyMode(StrEnum):
    STICKY = "sticky"
    NONE = "none"  # fresh randomness per release: only for demonstrating the averaging attack


class RepublicationMode(StrEnum):
    """How a returning respondent's quasi-identifier group is republished (docs/consistency.md)."""

    # changed respondents are regrouped at once among the window's new and changed records; a
    # group left with fewer than k live members is re-formed the same way (fresh; a mover's
    # linked candidate set is an intersection, measured)
    REGROUP = "regroup"
    # fixed cohorts: a cohort's tuple is recomputed from its present members' current values;
    # every respondent's linked candidate set stays >= k (marginals of nominal attributes lag)
    COHORT = "cohort"
    # before 0.2: a changed respondent stays in its group while its departure would leave it
    # with fewer than k live members (republishes its first tuple; no per-release k)
    DEFERRED = "deferred"
    # fixed cohorts, every active member in every release (an absent one imputed: the claim's
    # numbers carried forward, its other values aged), an analysis weight raked per release so every
    # category's weighted share is current; waves decided whole as they close (gateway/panel/)
    PANEL = "panel"


class GroupingPool(StrEnum):
    """When new and changed respondents are microaggregated."""

    WINDOW = "window"  # in every window, once k of them wait there
    # when their release closes (a later wave, hold time over, the last flush): one pool per
    # release, so groups are formed from nearer neighbours (less information loss) at the
    # price of waiting up to a wave
    RELEASE = "release"


class SmallStrata(StrEnum):
    MERGE = "merge"  # strata below k pooled (the pool, if still below k, joins the smallest)
    SUPPRESS = "suppress"  # their records published with the quasi-identifiers suppressed


MISSING_LABEL = "<missing>"

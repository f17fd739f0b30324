"""What each republication mode guarantees and what it costs, in words and as flags: the one
statement ``check-policy``, the metadata topic and docs/consistency.md give."""

from __future__ import annotations

from typing import Any

from gateway.policy import GroupingPool, MicroaggAlgorithm, Policy, RepublicationMode

_MODES = {
    RepublicationMode.REGROUP: (
        "a respondent whose categories change is regrouped in the release it changes in, among "
        "that release's new and changed respondents; one whose numbers change stays, and its "
        "group's tuple is recomputed from its publishers' current values; a group left with "
        "fewer than k live members is re-formed. Published tuples follow the truth. A "
        "respondent that moved can be linked across releases to fewer than k candidates (the "
        "intersection of its old and new classes): its sensitive values are then protected by "
        "randomized response and noise alone; the share is measured and exported"
    ),
    RepublicationMode.COHORT: (
        "a group (cohort) keeps its members for good; the first publishers of each release "
        "recompute its tuple from their current values, and a member publishes its tuple only "
        "while the respondents sharing it in every release it published in stay k or more "
        "(else it waits, then is published with its quasi-identifiers suppressed). Every "
        "linked candidate set stays at k or more, also under attrition; a changed category "
        "is outvoted by its cohort's members, so nominal marginals lag the truth"
    ),
    RepublicationMode.PANEL: (
        "cohorts formed once by whole-key MDAV are kept for good (merged whole, never split); "
        "every active member is published in every wave, an absent one imputed (numbers "
        "of the claim carried forward; its categories, and every answer outside the claim, aged "
        "by the moves of those present in both waves; randomized and noised with its sticky "
        "draws) and not told apart from a present one; a member "
        "absent for retire_after_waves waves retires when every other member's linked set "
        "stays >= k. A cohort publishes its members' mean numbers and one allowed combination "
        "of categories, and every record an analysis weight raked per wave so that every "
        "category's weighted share is its current share. Every linked candidate set stays at "
        "k or more; a wave is published whole when it closes"
    ),
    RepublicationMode.DEFERRED: (
        "the behaviour before republication modes: a changed respondent stays in its group "
        "while its departure would leave fewer than k live members, republishing its first "
        "tuple; no per-release k under attrition and tuples that drift from the truth"
    ),
}


# what an analyst of a panel's releases needs beyond the matrices (docs/consistency.md,
# "Analysing a panel release")
PANEL_ANALYSIS = (
    "Estimate with the weight field: in each wave the weights sum to the sampling weights of "
    "every active member, the imputed ones included (up to targets rounded to k records). A "
    "respondent's randomized answer is drawn once per true value: an unchanged value "
    "republishes the same answer in every wave, a changed one is drawn afresh, independently "
    "of the first. Two waves' estimates therefore share draws and are positively correlated: "
    "the sum of their variances bounds the variance of their difference from above. Record "
    "ids are keyed per respondent and wave, so records link across waves only through a "
    "published pseudonym."
)


def republication_statement(policy: Policy) -> dict[str, Any]:
    """The policy's republication mode, its settings and guarantees (JSON-ready)."""
    rep = policy.republication
    k = policy.microaggregation.k
    wave = rep.wave_attribute
    release = f"a wave (records with the same {wave})" if wave is not None else "an output window"
    deferred = rep.mode is RepublicationMode.DEFERRED
    if policy.microaggregation.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS:
        return _recoding(policy, release)
    panel = rep.mode is RepublicationMode.PANEL
    pool = (
        "when their wave closes (the next wave arriving for close_grace_seconds, or "
        "max_wave_seconds after its first record)"
        if panel
        else "when its release closes (a later wave, its hold time, or the last flush)"
        if rep.pool is GroupingPool.RELEASE and wave is not None and not deferred
        else "in each window, once k of them wait"
    )
    statement: dict[str, Any] = {
        "mode": rep.mode.value,
        "wave_attribute": wave,
        "pool": GroupingPool.RELEASE.value if panel else rep.pool.value,
        "slack": rep.slack,
        "release": release,
        "k_per_release": not deferred,
        "k_over_history": True,
        "linked_sets_at_least_k": rep.mode in (RepublicationMode.COHORT, RepublicationMode.PANEL),
        "follows_changes": rep.mode is RepublicationMode.REGROUP,
        "statement": (
            f"{rep.mode.value}: {_MODES[rep.mode]}. A release is {release}; every published "
            f"tuple is shared by at least {k} respondents "
            + ("over the whole history" if deferred else "within its release and over the history")
            + f"; new and changed respondents are grouped {pool}"
            + (f", in groups of at least {k + rep.slack} (slack {rep.slack})" if rep.slack else "")
            + "."
        ),
    }
    if panel:  # keys of their own, so that the other modes' metadata keeps its bytes
        statement["every_member_every_release"] = True
        statement["weight_field"] = rep.weight_name
        statement["analysis"] = PANEL_ANALYSIS
        statement["retirement"] = _retirement(rep.slack, rep.retire_after, k)
    return statement


def _retirement(slack: int, after: int, k: int) -> str:
    """What retire_after_waves does under the policy's slack: whole-key MDAV forms cohorts of
    exactly k for the most part, and a member of one never retires (its class mates' sets
    would fall below k). A probe's 30-wave panel losing 3 % of its members for good each wave
    retired nobody under slack 0: 47 % of wave 30's records were imputed."""
    if slack == 0:
        return (
            f"slack 0: cohorts are formed of {k} members for the most part, and a member of a "
            f"cohort of {k} never retires, so members who left for good are imputed in every "
            f"later wave; with slack >= 1 (cohorts of at least {k} + slack) a member absent "
            f"{after} waves in a row retires while its cohort keeps {k} or more"
        )
    return (
        f"a member absent {after} waves in a row retires while its cohort keeps {k} or more "
        f"(cohorts are formed of at least {k + slack}: slack {slack})"
    )


def _recoding(policy: Policy, release: str) -> dict[str, Any]:
    """recode_suppress in the stream (gateway/grouping/recode_stream.py): no groups, the
    exact recoded tuples of each wave."""
    rep, k = policy.republication, policy.microaggregation.k
    return {
        "mode": "recode_suppress",
        "wave_attribute": rep.wave_attribute,
        "pool": rep.pool.value,
        "slack": 0,
        "release": release,
        "k_per_release": True,
        "k_over_history": True,
        "linked_sets_at_least_k": False,
        "follows_changes": True,
        "statement": (
            "recode_suppress: the keys are recoded (hierarchies, bins), then cells suppressed, "
            "least important key first, when a wave closes, until every exact published tuple "
            f"(a suppressed cell a value of its own) is shared by at least {k} respondents "
            f"within its release and so over the history. A release is {release}. A "
            "respondent whose recoded tuple is unchanged keeps the cells it had suppressed; "
            "a record late for its wave joins one of that wave's classes, else is withheld. "
            "No published value is wrong: each is the recoded truth or missing."
        ),
    }

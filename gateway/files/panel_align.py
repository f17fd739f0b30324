"""`privgw evaluate` on a panel release (`privgw protect --state-dir`): its rows paired with the
original's by record id.

A panel release is published in the order of its record ids, not the input's (an order that
put present members first would tell the imputed ones apart), and it holds a record for every
active member, the absent ones imputed. Paired by position, its rows met other respondents'
(on one wave of Adult: SSE/SST 178.6 % where the pairs give 22.0 %, disclosure risk 0.0003
where they give 0.124). A record id is keyed by the deployment secret per respondent and wave,
so the data owner, who holds the secret, pairs each original row with its published record;
the imputed records, which no original row answered, are left out of the pairwise measures and
counted."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gateway.errors import InputDataError
from gateway.files.fileio import read_table, records_from_frame
from gateway.keyed.keyed import Keyring, SecretError, load_secret
from gateway.panel.output import panel_record_id
from gateway.policy import Policy, RepublicationMode

ID = "record_id"


def is_panel_release(prot: pd.DataFrame, policy: Policy | None) -> bool:
    """A release of a ``panel`` policy's waves, with the record ids it was published under."""
    return (
        policy is not None
        and policy.republication.mode is RepublicationMode.PANEL
        and policy.republication.wave_attribute is not None
        and policy.input.respondent_id is not None
        and ID in prot.columns
    )


def align_panel_release(
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    policy: Policy,
    files: tuple[str | Path, str | Path],
    environ: Mapping[str, str] = os.environ,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """``orig``'s rows that a record of ``prot`` answers (a respondent's first row of a wave),
    each with that record, in ``orig``'s order; and what was left out."""
    original, protected = files
    try:
        keyring = Keyring(load_secret(environ))
    except SecretError as exc:
        raise InputDataError(
            f"{protected} is a panel release (a record id per respondent and wave, in id "
            "order, the absent members imputed): evaluate pairs its rows with the original's "
            f"by record id, which needs the deployment secret ({exc})"
        ) from None
    ids = _record_ids(original, policy, keyring)
    first = ~pd.Series(ids).duplicated().to_numpy()  # a repeated answer was not published
    at = pd.Index(prot[ID].astype(str)).get_indexer(pd.Index(ids))
    if (at[first] < 0).any():
        raise InputDataError(
            f"{int((at[first] < 0).sum())} of {original}'s respondents have no record in "
            f"{protected} under this secret: give the release protected from this file, "
            "with the secret it was protected with"
        )
    keep = first & (at >= 0)
    paired = orig.loc[keep].reset_index(drop=True)
    published = prot.iloc[at[keep]].reset_index(drop=True)
    left = {
        "paired_by": ID,
        "imputed_rows_excluded": len(prot) - int(keep.sum()),
        "repeated_rows_excluded": int((~first).sum()),
    }
    return paired, published, left


def _record_ids(original: str | Path, policy: Policy, keyring: Keyring) -> list[str]:
    """Each original row's record id, as protect computes it from the row's respondent id and
    wave."""
    wave = policy.republication.wave_attribute
    assert wave is not None
    records = records_from_frame(read_table(original, as_text=True), policy, original)
    rids = [r.respondent_id for r in records]
    waves = [r.values.get(wave) for r in records]
    if None in rids or None in waves:
        raise InputDataError(
            f"{original}: every row of a panel file needs a respondent id and a wave "
            f"('{policy.input.respondent_id}', '{wave}')"
        )
    keys = keyring.respondent_keys([str(rid) for rid in rids])
    return [
        panel_record_id(key, int(w))  # type: ignore[call-overload]
        for key, w in zip(keys, waves, strict=True)
    ]

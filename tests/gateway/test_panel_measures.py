"""The panel window's utility and risk measures (gateway.panel.measures): numeric utility over
the present members only, the whole-key classes over every published record of a wave's
release, suppressed records apart."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.measures import quality
from gateway.panel.measures import PanelMeasureSpec, panel_measures

SPEC = PanelMeasureSpec(
    wave="wave", claim=["age", "sex"], numeric=["age"], sensitive=["income"], k=2, p_pct=10.0
)


@settings(max_examples=100, deadline=None)
@given(
    n_in=st.integers(2, 12),
    imputed=st.integers(0, 6),
    seed=st.integers(0, 2**31),
)
def test_measures_count_classes_per_wave_and_numbers_over_present_members(
    n_in: int, imputed: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    total = n_in + imputed
    pub_idx = list(range(total))
    truth = {"age": rng.integers(18, 90, size=n_in).tolist()}
    published_age = rng.choice([30.0, 45.5, 60.0], size=total).tolist()
    cols = [
        rng.choice([1, 2], size=total).tolist(),  # wave
        published_age,
        rng.choice(["F", "M"], size=total).tolist(),
        rng.choice(["<=50K", ">50K"], size=total).tolist(),
    ]
    suppressed = {int(i) for i in rng.choice(total, size=min(2, total - 1), replace=False)}
    got = panel_measures(
        SPEC, ["wave", "age", "sex", "income"], cols, pub_idx, truth,
        n_in=n_in, suppressed=suppressed,
    )  # fmt: skip
    rows = [j for j in range(total) if j not in suppressed]
    classes: dict[tuple[object, ...], int] = {}
    for j in rows:
        t = (cols[0][j], cols[1][j], cols[2][j])
        classes[t] = classes.get(t, 0) + 1
    assert got["key_records"] == len(rows) and got["key_suppressed"] == len(suppressed)
    assert got["key_smallest_class"] == min(classes.values())
    assert got["key_uniques"] == sum(c == 1 for c in classes.values())
    assert np.isclose(got["key_global_risk"], len(classes) / len(rows))
    below = sum(c for c in classes.values() if c < SPEC.k)
    assert np.isclose(got["key_share_below_k"], below / len(rows))
    incomes: dict[tuple[object, ...], set[object]] = {}
    for j in rows:
        incomes.setdefault((cols[0][j], cols[1][j], cols[2][j]), set()).add(cols[3][j])
    assert got["ldiv_min:income"] == min(len(v) for v in incomes.values())
    alone = [v for v in (cols[3][j] for j in rows) if [cols[3][i] for i in rows].count(v) == 1]
    assert got["sensitive_uniques"] == len(alone)
    present = [j for j in rows if j < n_in]
    if len(present) > 1:
        x = np.array([[truth["age"][j]] for j in present], dtype=float)
        masked = np.array([[published_age[j]] for j in present], dtype=float)
        assert np.isclose(got["sse_sst_pct"], quality.sse_sst_pct(x, masked), equal_nan=True)
    else:
        assert "sse_sst_pct" not in got  # an imputed record has no current truth

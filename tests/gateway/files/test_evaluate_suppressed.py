"""`privgw evaluate` on a file with suppressed cells (probe analyst D4): on `kanon`'s output it
dropped every row holding a suppression, reported 0 information loss and disclosure risk 1 for
what was left, and said "excluded_incomplete_rows": 172 beside "n_excluded": 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from gateway.commands.cli import main


def _evaluate(capsys: pytest.CaptureFixture[str], *args: Path) -> dict[str, object]:
    code = main(["evaluate", *map(str, args), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = orjson.loads(out.out)
    assert isinstance(result, dict)
    return result


def test_a_suppressed_cell_is_counted_as_the_loss_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    original = pd.DataFrame({"a": rng.normal(50, 10, 40).round(1), "b": rng.integers(1, 9, 40)})
    original.loc[7, "b"] = np.nan  # missing in the original: nothing to compare with
    published = original.copy()
    published.loc[[2, 11, 30], "a"] = np.nan  # suppressed, the rest published unchanged
    published.loc[5, "b"] = np.nan
    original.to_csv(src := tmp_path / "original.csv", index=False)
    published.to_csv(out := tmp_path / "published.csv", index=False)

    result = _evaluate(capsys, src, out)
    assert result["records"] == 40
    # the two counts agree: only the row without an original value is left out
    assert result["excluded_incomplete_rows"] == result["n_excluded"] == 1
    assert result["n_records"] == 39
    assert result["suppressed_cells"] == {"a": 3, "b": 1}
    # each suppressed cell stands for its column's mean (what SSE/SST's total calls no
    # information): the loss is theirs alone
    rows = original.drop(index=7)
    x = rows.to_numpy(dtype=float)
    stand = published.drop(index=7).fillna(original.mean()).to_numpy(dtype=float)
    sd = x.std(axis=0, ddof=1)
    sse = (((x - stand) / sd) ** 2).sum()
    sst = (((x - x.mean(axis=0)) / sd) ** 2).sum()
    assert result["sse_sst_pct"] == pytest.approx(100 * sse / sst, rel=1e-9)
    assert 0 < float(result["sse_sst_pct"]) < 100  # type: ignore[arg-type]
    assert float(result["dld"]) < 1  # type: ignore[arg-type]

    # nothing suppressed: no loss, no such key
    clean = _evaluate(capsys, src, src)
    assert clean["sse_sst_pct"] == 0 and "suppressed_cells" not in clean
    assert clean["excluded_incomplete_rows"] == clean["n_excluded"] == 1

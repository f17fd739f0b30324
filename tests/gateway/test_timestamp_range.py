"""Issue 45, item 1: a valid ISO 8601 timestamp whose instant lies outside what UTC represents
(``9999-12-31T23:00:00-01:00``) overflowed when coarsened to a minute or an hour, and stopped
the stream. Every extreme valid timestamp is now either coarsened under every unit, or refused
by validation (``out_of_range``, or exit 2 in ``protect``): nothing else may raise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.errors import InputDataError
from gateway.files.fileio import records_from_frame
from gateway.mechanisms import masking
from gateway.mechanisms.masking import TimestampFault
from gateway.policy import Policy, TimeUnit, parse_policy
from gateway.validation import DLQReason, Rejection, Validator


def _policy(unit: TimeUnit) -> Policy:
    return parse_policy(
        {
            "input": {"respondent_id": "rid"},
            "attributes": {
                "seen": {
                    "role": "other",
                    "type": "timestamp",
                    "method": "coarsen",
                    "coarsen": {"unit": unit.value},
                }
            },
        }
    )


POLICIES = {unit: _policy(unit) for unit in TimeUnit}
VALIDATORS = {unit: Validator(p) for unit, p in POLICIES.items()}

# offsets up to ±23:59:59.999999 (what fromisoformat reads), on the first and last days too
_OFFSETS = st.one_of(
    st.none(),
    st.just(UTC),
    st.timedeltas(
        min_value=-timedelta(hours=24) + timedelta(microseconds=1),
        max_value=timedelta(hours=24) - timedelta(microseconds=1),
    ).map(timezone),
)
_EDGE_DAYS = st.sampled_from([datetime.min, datetime.max.replace(microsecond=0)])
_INSTANTS = st.one_of(
    st.datetimes(),
    st.builds(  # the first or last day, at any time of it
        lambda day, t: datetime.combine(day.date(), t),
        _EDGE_DAYS,
        st.times(),
    ),
)
_SPECS = st.sampled_from(["auto", "hours", "minutes", "seconds", "milliseconds", "microseconds"])


@st.composite
def extreme_iso(draw: st.DrawFn) -> str:
    """Valid ISO 8601 text (as ``datetime.isoformat`` writes it), biased to years 1 and 9999."""
    local = draw(_INSTANTS)
    tz = draw(_OFFSETS)
    sep, spec = draw(st.sampled_from("T ")), draw(_SPECS)
    text = local.replace(tzinfo=tz).isoformat(sep=sep, timespec=spec)
    if tz is UTC and draw(st.booleans()):
        text = text.removesuffix("+00:00") + "Z"
    return text


@settings(max_examples=400, deadline=None)
@given(extreme_iso())
@example("9999-12-31T23:00:00-01:00")
@example("0001-01-01T00:30:00+01:00")
@example("9999-12-31T23:59:59.999999-23:59:59.999999")
@example("0001-01-01T00:00:00+23:59")
@example("0001-01-01T00:00:00-23:59")
@example("9999-12-31T23:59:59+23:59")
def test_an_extreme_timestamp_is_coarsened_under_every_unit_or_dead_lettered(text: str) -> None:
    fault = masking.timestamp_fault(text)
    assert fault is not TimestampFault.NOT_ISO_8601, text  # the strategy writes valid ISO 8601
    raw = orjson.dumps({"rid": "r1", "seen": text})
    frame = pd.DataFrame({"rid": ["r1"], "seen": [text]})
    for unit, validator in VALIDATORS.items():
        res = validator.decode_and_validate(raw, b"r1")
        if fault is TimestampFault.OUT_OF_RANGE:
            assert res == Rejection(DLQReason.OUT_OF_RANGE, "seen", "OverflowError")
            with pytest.raises(InputDataError, match=r"'seen'.*representable range.*data row 1"):
                records_from_frame(frame, POLICIES[unit], "in.csv")
            continue
        assert not isinstance(res, Rejection), (unit, res)
        (published,) = masking.coarsen([text], unit)
        assert published is not None  # a month is published as YYYY-MM, without a day
        day = f"{published}-01" if unit is TimeUnit.MONTH else published
        assert masking.parse_timestamp(day) is not None, (unit, published)
        assert records_from_frame(frame, POLICIES[unit], "in.csv")[0].values == {"seen": text}


def test_the_instants_that_leave_utc_are_exactly_the_refused_ones() -> None:
    assert masking.timestamp_fault("9999-12-31T23:00:00-01:00") is TimestampFault.OUT_OF_RANGE
    assert masking.timestamp_fault("0001-01-01T00:30:00+01:00") is TimestampFault.OUT_OF_RANGE
    assert masking.timestamp_fault("9999-12-31T23:00:00+01:00") is None  # 22:00 UTC
    assert masking.timestamp_fault("0001-01-01T00:30:00-01:00") is None  # 01:30 UTC
    assert masking.timestamp_fault("9999-12-31T23:59:59") is None  # no zone: never converted
    assert masking.timestamp_fault("yesterday") is TimestampFault.NOT_ISO_8601
    assert masking.coarsen(["9999-12-31T23:00:00-01:00"], TimeUnit.HOUR) == [None]


_OTHER_FORMS = st.one_of(
    st.none(),
    st.dates().map(lambda d: d.isoformat()),  # a date alone
    st.datetimes().map(lambda t: t.strftime("%Y%m%dT%H%M%S")),  # the basic format
    st.datetimes().map(lambda t: t.strftime("%Y%m%d1%H%M")),  # a digit as the separator
    st.dates().map(lambda d: "{}-W{:02d}-{}".format(*d.isocalendar())),  # a week date
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(extreme_iso(), _OTHER_FORMS), max_size=8))
@example(["2024-02-29T23:59:59+05:00", "1970-01-01", "2000-01-02T00:00Z", None])
@example(["0002-01-01T00:00:00", "9998-12-31 23:59:59.5-23:00"])
@example(["2020-01-01", "9999-12-31T23:00:00-01:00"])  # no UTC instant: None
@example(["2020010110500"])  # 2020-01-01 05:00, ten digits in front
def test_a_column_of_timestamps_is_coarsened_as_each_timestamp_would_be(texts: list[str]) -> None:
    """The columnar path (dates taken from ``YYYY-MM-DD`` text) publishes what parsing each
    timestamp does, under every unit, whatever else the column holds."""
    for unit in TimeUnit:
        assert masking.coarsen(texts, unit) == masking.coarsen_each(texts, unit), unit

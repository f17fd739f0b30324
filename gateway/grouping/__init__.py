"""Grouping: who publishes which quasi-identifier tuple, within a window and across releases.

* :mod:`gateway.grouping.microaggregation` — MDAV (sdcMicro's partition) and individual ranking
  over numeric keys; :mod:`gateway.grouping.mixed_microaggregation` — MDAV over numeric,
  ordinal and nominal keys together (the whole-key k claim);
  :mod:`gateway.grouping.recode_suppress` — global recoding then local suppression, the
  non-perturbative route to the same claim; :mod:`gateway.grouping.recode_stream` and
  :mod:`gateway.grouping.exact_suppression` — the same in the stream, exact-tuple k per wave
  with sticky suppressed cells;
* :mod:`gateway.grouping.decision` — a window's decision: each record's tuple and group, held
  or suppressed; :mod:`gateway.grouping.guarantees` — what each republication mode guarantees;
* :mod:`gateway.grouping.release` — what a release is (a wave, or an output window) and when one
  is closed; :mod:`gateway.grouping.parking` — waves decided when they close;
* :mod:`gateway.grouping.registry` — a group's stored entry: its tuple, members, live count and
  the publication masks that give every member's linked candidate set;
* :mod:`gateway.grouping.republish` — the republication modes ``regroup`` and ``cohort``:
  per-release quorum, departures, re-formation of groups among new and changed records;
* :mod:`gateway.grouping.strata` and :mod:`gateway.grouping.l_diversity` — groups that never
  cross a stratum, groups merged until they hold l distinct sensitive values (pure functions);
  :mod:`gateway.grouping.file_claim` runs them over a file, :mod:`gateway.grouping.scope` says
  how the stream runs them across windows and releases.
"""

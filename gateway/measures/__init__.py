"""Measures of what a release protects and what it keeps: pure functions of the original and
the published values (never the engine, never a file).

* information loss and disclosure risk of numeric data — :mod:`~gateway.measures.quality`
  (with :mod:`~gateway.measures.information_loss`, :mod:`~gateway.measures.disclosure_risk`);
* risk over the whole published key — :mod:`~gateway.measures.key_risk` (class sizes,
  l-diversity), :mod:`~gateway.measures.linkage` (distance-based record linkage);
* frequency risk of a categorical key (sdcMicro's ``measure_risk``, ``suda2``) —
  :mod:`~gateway.measures.frequency_risk`, :mod:`~gateway.measures.suda`,
  :mod:`~gateway.measures.release_risk`;
* adversaries on a publication history — :mod:`~gateway.measures.attack`;
* the analyst's side of randomized response — :mod:`~gateway.measures.reconstruction`,
  :mod:`~gateway.measures.published`, :mod:`~gateway.measures.versioned_counts`.
"""

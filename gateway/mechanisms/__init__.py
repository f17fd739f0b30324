"""The protection methods. Each published attribute outside the k claim gets one object, built
once from the policy by :mod:`~gateway.mechanisms.registry` (method -> builder), with one
interface (:class:`~gateway.mechanisms.protection.Protection`: ``apply(values, draws) ->
Published``, its ``cost``, what the metadata publishes of it):

* randomized response with its matrix P, γ and ε — :mod:`~gateway.mechanisms.rr_protection`
  over :mod:`~gateway.mechanisms.randomized_response`, built from a privacy strength by
  :mod:`~gateway.mechanisms.rr_constructions`;
* noise (after top/bottom coding, before rounding) — :mod:`~gateway.mechanisms.noise_protection`;
* top/bottom coding, generalization, coarsening of timestamps, rounding of a weight, keep —
  :mod:`~gateway.mechanisms.recodings`; their column functions in
  :mod:`~gateway.mechanisms.masking`;
* the sticky draws of randomized response and noise, looked up in and stored to the
  respondents' states — :mod:`~gateway.mechanisms.sticky`;
* local suppression to k — :mod:`~gateway.mechanisms.local_suppression`;
* the stamp naming the matrix each published randomized value was drawn under —
  :mod:`~gateway.mechanisms.stamp`.

Where a mechanism draws, it takes uniforms from an injected source, never a generator of its
own. Mechanisms know neither the engine, the state store, the grouping nor the files (local
suppression counts its matches with :func:`gateway.measures.frequency_risk.sample_frequencies`).
A new mechanism is a module here and one line in the registry.
"""

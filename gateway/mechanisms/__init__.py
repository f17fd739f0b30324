"""The protection methods, each a pure function of the values it protects and the policy's
spec (and, where it draws, an injected source of uniforms — never a generator of its own):

* randomized response with its matrix P, γ and ε — :mod:`~gateway.mechanisms.randomized_response`,
  built from a privacy strength by :mod:`~gateway.mechanisms.rr_constructions`;
* noise, rounding to a step, top/bottom coding, generalization, coarsening of timestamps —
  :mod:`~gateway.mechanisms.masking`;
* local suppression to k — :mod:`~gateway.mechanisms.local_suppression`;
* the stamp naming the matrix each published randomized value was drawn under —
  :mod:`~gateway.mechanisms.stamp`.

Mechanisms know neither the engine, the state nor the files (local suppression counts its
matches with :func:`gateway.measures.frequency_risk.sample_frequencies`).
"""

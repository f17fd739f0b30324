"""The deployment secret at the worker's start: its fingerprint on the metadata topic, and
the draw derivation settled."""

"""Everything derived from the deployment secret: keyed digests and draws, how draws are
derived, what a secret must be, and injectable randomness for tests."""

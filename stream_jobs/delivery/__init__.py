"""Producing and committing: a window's outputs out and acknowledged, then its offsets
committed; the metadata topic, and the protected topics read back."""

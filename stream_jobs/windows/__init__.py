"""Windows: when to flush, which records are held, and a closed window's way through the
engine to its results."""

"""Grouping beyond one MDAV partition: strata (groups never cross a stratum) and l-diversity
enforcement (groups merged until they hold l distinct sensitive values). Pure functions over
a window held as columns; the file workflow uses them, the stream engine does not yet."""

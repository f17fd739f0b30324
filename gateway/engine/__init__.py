"""The window step: a window's keys, the claim, the published columns, the report and the
metadata of a release (``engine.Engine.protect_window``); shards of several engines."""

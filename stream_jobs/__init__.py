"""Kafka wiring for privgw: worker, windows, codecs, DLQ, metadata, simulator, embedded broker."""

"""Consuming and validation: where each fetched record goes, and the dead-letter path."""

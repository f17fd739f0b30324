"""privgw's privacy engine: pure numpy/pandas/scipy, no Kafka, no Prometheus, no asyncio."""

__version__ = "0.1.0"

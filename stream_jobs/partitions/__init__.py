"""Partitions and their state: rebalancing, the sqlite backend's partition ledger, the
partitioned backend's routing and changelog."""

"""The Kafka commands of ``privgw`` (``run``, ``simulate``, ``demo``, ``offsets``, policy
upgrades, checks before a start), the survey simulator and the embedded broker."""

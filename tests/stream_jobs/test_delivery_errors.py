"""Which broker errors the worker waits out (re-sending a window, retrying a commit) and which
fail it: an outage is waited for; a refusal that will not change is not hidden by retrying."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CoordinatorNotAvailableError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from stream_jobs.delivery.delivery import _transient


@pytest.mark.parametrize(
    ("error", "wait"),
    [
        (KafkaTimeoutError(), True),  # a batch that expired while the broker was away
        (KafkaConnectionError(), True),
        (NotLeaderForPartitionError(), True),
        (UnknownTopicOrPartitionError(), True),  # a restarted broker before its topics are back
        (CoordinatorNotAvailableError(), True),
        (TopicAuthorizationFailedError(), False),
        (MessageSizeTooLargeError(), False),
    ],
)
def test_outages_are_waited_for_and_refusals_fail_the_worker(error: KafkaError, wait: bool) -> None:
    assert _transient(error) is wait

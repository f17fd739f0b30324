"""The worker's log lines: level and format (PRIVGW_LOG_LEVEL, PRIVGW_LOG_FORMAT).

``json`` writes one object per line (time, level, logger, message) for log shippers that parse
fields. Either way a line never holds a record's values: the code logs counts, topic names
and exception class names only.
"""

from __future__ import annotations

import logging
import time

import orjson

from stream_jobs.ops import client_log
from stream_jobs.settings import WorkerSettings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line; exceptions by class name only (a message may carry data)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            doc["exception"] = record.exc_info[0].__name__
        return orjson.dumps(doc).decode()


def configure_logging(settings: WorkerSettings) -> None:
    """Level and format of every handler of the root logger (``privgw``'s main sets one up)."""
    root = logging.getLogger()
    root.setLevel(settings.log_level)
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    formatter = JsonFormatter() if settings.log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in root.handlers:
        handler.setFormatter(formatter)
    # aiokafka's DEBUG lines dump whole requests and responses, record bytes included:
    # never let them through, whatever the level (no raw personal value in a log line)
    logging.getLogger("aiokafka").setLevel(max(logging.INFO, root.level))
    # and while the broker is away, one line per period rather than thousands
    client_log.install(settings.client_log_interval_seconds)

"""uvicorn's access log, made safe and readable for a busy coordinator.

* ``?access_token=`` is blanked out: the live page's event stream passes the operator token
  that way (EventSource cannot send headers), and a log file must not hold it.
* Successful telemetry posts are left out: every rank 0 reports every few seconds, a large
  cluster thousands of times a second, which would drown everything else (and cost the hot
  route a log line each). Their failures, and every other request, are still logged.
"""

from __future__ import annotations

import logging
import re

#: ``access_token=<anything up to & or the end>`` in a logged URL.
_QUERY_TOKEN = re.compile(r"(access_token=)[^&\s]*")
_TELEMETRY = re.compile(r"^/v1/jobs/[^/]+/(telemetry|decision)$")


class AccessLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        path, status = args[2], args[4]
        if isinstance(path, str) and isinstance(status, int) and status < 300 and _TELEMETRY.match(path):
            return False
        record.args = tuple(_QUERY_TOKEN.sub(r"\1[redacted]", a) if isinstance(a, str) else a for a in args)
        return True


def tune_access_log() -> None:
    """Install the filter on ``uvicorn.access`` (idempotent)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, AccessLogFilter) for f in logger.filters):
        logger.addFilter(AccessLogFilter())

"""The container's HEALTHCHECK: exit 0 when /healthz answers 200 on the port gunicorn binds.

Python's standard library only: the slim image has no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def healthz_url() -> str:
    first = os.environ.get("QUEUELOG_BIND", "0.0.0.0:8000").split(",")[0].strip()
    port = first.rsplit(":", 1)[-1] if ":" in first else os.environ.get("PORT", "8000")
    return f"http://127.0.0.1:{int(port)}/healthz"


def main() -> int:
    try:
        with urllib.request.urlopen(healthz_url(), timeout=2) as response:  # noqa: S310 (http to loopback)
            return 0 if response.status == 200 else 1
    except (OSError, ValueError):  # not answering, or not bound to a TCP port
        return 1


if __name__ == "__main__":
    sys.exit(main())

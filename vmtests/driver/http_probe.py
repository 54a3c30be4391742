"""One HTTP ``GET`` from the host running the suite, for readiness probes and checks that do not
need a process on the machine."""

from __future__ import annotations

import http.client

PROBE_TIMEOUT = 5.0


def http_status(
    host: str, port: int, path: str, timeout: float = PROBE_TIMEOUT
) -> tuple[int | None, str]:
    """``GET http://host:port/path``: the status (None without an answer) and what was seen,
    for error messages (``200 OK``, ``ConnectionRefusedError: ...``)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, f"{response.status} {response.reason}"
    except (OSError, http.client.HTTPException) as error:
        return None, f"{type(error).__name__}: {error}"
    finally:
        connection.close()

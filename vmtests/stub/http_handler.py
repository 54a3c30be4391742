"""The HTTP side of the stub server: routes, JSON bodies, SSE streaming and access logs.

``ThreadingHTTPServer`` runs each connection in its own thread; the engine's slots, not the
HTTP server, cap how many requests run at once (``--max-num-seqs``), the rest wait.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vmtests.contracts.serving import API_KEY_GUARDED_PREFIX
from vmtests.stub import openai_api
from vmtests.stub.args import ServeArgs
from vmtests.stub.engine import Engine, EngineRequest, RequestError, RequestStats
from vmtests.stub.features import ActiveFeatures
from vmtests.stub.release import VLLM_VERSION
from vmtests.stub.vllm_log import VllmLog

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GET_ROUTES = ("/health", "/v1/models", "/version", "/metrics")


@dataclass
class ServingApp:
    """Everything a request handler needs."""

    engine: Engine
    args: ServeArgs
    active: ActiveFeatures
    printer: VllmLog
    api_key_hashes: tuple[bytes, ...] = field(default=(), repr=False)
    """sha256 of each accepted API key; empty: no key is required."""

    def authorized(self, path: str, authorization: str | None) -> bool:
        """vLLM's ``AuthenticationMiddleware`` (0.16 ``entrypoints/openai/server_utils.py``):
        with keys, a path under ``/v1`` needs ``Authorization: Bearer <key>`` (the scheme in any
        case); every other path is open."""
        if not self.api_key_hashes or not path.startswith(API_KEY_GUARDED_PREFIX):
            return True
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(key.encode()).digest()
        return any(secrets.compare_digest(digest, known) for known in self.api_key_hashes)


def api_key_hashes(keys: Sequence[str]) -> tuple[bytes, ...]:
    """The hashes ``ServingApp`` compares against, for the non-empty ``keys``."""
    return tuple(hashlib.sha256(key.encode()).digest() for key in keys if key)


class StubHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server carrying the app; a deep backlog for bursts of clients."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], app: ServingApp) -> None:
        self.app = app
        super().__init__(address, ServingHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closes its keep-alive connection after its answer (a reset while the
        next request line is read) is no error, and uvicorn logs nothing of it; anything else
        gets socketserver's traceback."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class ServingHandler(BaseHTTPRequestHandler):
    """Routes of vLLM's OpenAI-compatible server."""

    protocol_version = "HTTP/1.1"
    server: StubHTTPServer

    # ---- plumbing --------------------------------------------------------------------------

    @property
    def app(self) -> ServingApp:
        """The serving app of this server."""
        return self.server.app

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """uvicorn's access log line, e.g. ``127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK``."""
        status = HTTPStatus(int(code)) if str(code).isdigit() else None
        phrase = f"{code} {status.phrase}" if status else str(code)
        host, port = self.client_address[:2]
        self.app.printer.uvicorn(f'{host}:{port} - "{self.requestline}" {phrase}')

    def log_message(self, format: str, *args: Any) -> None:
        """Silence http.server's own stderr logging (errors are logged by the handlers)."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, openai_api.dumps(body), "application/json")

    def _send_error(self, error: RequestError) -> None:
        self._send_json(error.status, openai_api.error_body(error))

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError as error:
            raise RequestError(400, "BadRequestError", f"JSON decode error: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "BadRequestError", "request body must be a JSON object")
        return body

    # ---- routes ----------------------------------------------------------------------------

    def _unauthorized(self, path: str) -> bool:
        """Answer 401 as vLLM does when ``path`` needs a key the request lacks."""
        if self.app.authorized(path, self.headers.get("Authorization")):
            return False
        self._send_json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        """``/health``, ``/v1/models``, ``/version``, ``/metrics``."""
        path = self.path.split("?", 1)[0]
        app = self.app
        if self._unauthorized(path):
            return
        if path == "/health":
            status = 503 if app.engine.draining else 200
            self._send(status, b"", "application/json")
        elif path == "/v1/models":
            args = app.args
            body = openai_api.models_body(
                args.model_name, args.model_path, args.effective_max_model_len
            )
            self._send_json(200, body)
        elif path == "/version":
            self._send_json(200, {"version": VLLM_VERSION})
        elif path == "/metrics":
            self._send(200, app.engine.metrics.render().encode(), PROMETHEUS_CONTENT_TYPE)
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """``/v1/completions`` and ``/v1/chat/completions``."""
        path = self.path.split("?", 1)[0]
        if self._unauthorized(path):
            return
        if path in GET_ROUTES:
            self._send_json(405, {"detail": "Method Not Allowed"})
            return
        if path not in {"/v1/completions", "/v1/chat/completions"}:
            self._send_json(404, {"detail": "Not Found"})
            return
        try:
            with self.app.engine.admission():
                self._completions(path)
        except RequestError as error:
            self._send_error(error)
        except Exception as error:
            # A stub bug must show up as a failed request and a log line, not a silent hang.
            self.app.printer.error("start", f"unhandled error in {path}: {error!r}")
            self._send_error(RequestError(500, "InternalServerError", repr(error)))

    def _completions(self, path: str) -> None:
        app = self.app
        try:
            body = self._read_json()
            openai_api.check_model(body, app.args.model_name)
            prepared = openai_api.prepare(
                body,
                chat=path == "/v1/chat/completions",
                tool_calling=app.active.tool_calling,
                faults=app.engine.faults,
                max_model_len=app.args.effective_max_model_len,
            )
            app.engine.check_length(len(prepared.prompt_ids), prepared.max_tokens)
        except RequestError as error:
            self._send_error(error)
            return
        request = EngineRequest(prepared.prompt_ids, prepared.pieces)
        stats = RequestStats(finished_reason=openai_api.engine_finish_reason(prepared))
        tokens = app.engine.run(request, stats)
        try:
            if prepared.stream:
                self._stream(prepared, tokens)
            else:
                self._complete(prepared, tokens)
        except RequestError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            app.printer.warning("start", f"client of request {prepared.request_id} disconnected")
        finally:
            tokens.close()

    def _complete(self, prepared: openai_api.Prepared, tokens: Generator[str, None, None]) -> None:
        pieces = list(tokens)
        body = openai_api.full_response(
            prepared, self.app.args.model_name, "".join(pieces), len(pieces)
        )
        self._send_json(200, body)

    def _stream(self, prepared: openai_api.Prepared, tokens: Generator[str, None, None]) -> None:
        model = self.app.args.model_name
        first = next(tokens, None)  # errors before the first token still get an HTTP status
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        count = 0
        if prepared.chat:
            role = {"role": "assistant", "content": ""}
            self._event(openai_api.chunk(prepared, model, role, finished=False))
        piece = first
        try:
            while piece is not None:
                following = next(tokens, None)
                delta: Any = piece
                if prepared.chat:
                    delta = openai_api.chat_delta(prepared, piece, first=count == 0)
                self._event(openai_api.chunk(prepared, model, delta, following is None))
                count += 1
                piece = following
        except RequestError as error:
            # Headers are out: like vLLM, report the failure as an SSE error event.
            self._event(openai_api.error_body(error))
        if prepared.include_usage:
            self._event(openai_api.usage_chunk(prepared, model, count))
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _event(self, body: dict[str, Any]) -> None:
        self._write_chunk(b"data: " + openai_api.dumps(body) + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (an empty one ends the body); flushed so clients see it now."""
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

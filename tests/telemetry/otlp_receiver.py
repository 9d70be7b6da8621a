"""A real OTLP/HTTP receiver on 127.0.0.1, for tests that check what telemetry leaves the flow.

No OpenTelemetry Collector can be installed on this machine (no Debian or PyPI
package ships one; it is a prebuilt Go binary), so the receiver is a small
``http.server`` that decodes the protobuf requests the SDK's OTLP/HTTP exporters
POST, with the message classes from ``opentelemetry-proto``: what a collector
would receive, byte for byte. Import it after putting this folder on ``sys.path``.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector would see it (ids as lowercase hex)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    service: str


@dataclass(frozen=True)
class ReceivedLog:
    """One log record as a collector would see it (ids as lowercase hex)."""

    event_name: str
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class OTLPReceiver:
    """What arrived on ``/v1/traces`` and ``/v1/logs``, decoded."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    logs: list[ReceivedLog] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    endpoint: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take_traces(self, body: bytes) -> bytes:
        """Decode one trace export request and keep its spans."""
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            _attributes(span.attributes),
                            service,
                        )
                    )
        with self._lock:
            self.spans.extend(found)
        return ExportTraceServiceResponse().SerializeToString()

    def take_logs(self, body: bytes) -> bytes:
        """Decode one log export request and keep its records."""
        request = ExportLogsServiceRequest.FromString(body)
        found = [
            ReceivedLog(
                record.event_name,
                record.trace_id.hex(),
                record.span_id.hex(),
                _attributes(record.attributes),
            )
            for resource_logs in request.resource_logs
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
        ]
        with self._lock:
            self.logs.extend(found)
        return ExportLogsServiceResponse().SerializeToString()


def _handler_for(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    routes = {"/v1/traces": receiver.take_traces, "/v1/logs": receiver.take_logs}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the name http.server dispatches to
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            route = routes.get(self.path)
            content_type = self.headers.get("Content-Type") or ""
            if route is None or content_type != "application/x-protobuf":
                receiver.refused.append(f"{self.path} {content_type}")
                self.send_response(404 if route is None else 415)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            reply = route(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:  # the base signature
            return None  # keep the test output clean

    return Handler


@contextmanager
def serving_receiver() -> Iterator[OTLPReceiver]:
    """Serve an OTLP/HTTP receiver on 127.0.0.1 (a free port); stop it on exit."""
    receiver = OTLPReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(receiver))
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def site_with_endpoint(directory: Path, endpoint: str) -> Path:
    """Write the local site with ``otlp_endpoint`` set, as a user would."""
    text = (ROOT / "site-configs" / "local.toml").read_text()
    text = text.replace('name = "local"', 'name = "local-otlp"', 1)
    text = text.replace(
        'listen = "127.0.0.1"', f'listen = "127.0.0.1"\notlp_endpoint = "{endpoint}"', 1
    )
    path = directory / "local-otlp.toml"
    path.write_text(text)
    return path

"""Telemetry for a campaign run: the OpenTelemetry SDK, configured by the flow.

Spans and the gate's evaluation log records go to a JSON-lines file in the
campaign directory by default (readable offline, next to the provenance), and to
an OTLP/HTTP endpoint as well when the site names one. Only the flow process
installs providers; the libraries (``acceptance``, ``tasks``) use the API only.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import _logs, trace
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from flows._paths import append_private, private_dir


class JsonLinesFile:
    """Append JSON objects to a file, one per line, safely from several threads."""

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        self.path = path
        self._lock = threading.Lock()

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        """Append ``records`` (the file is private: it holds candidate values)."""
        lines = "".join(json.dumps(record, default=str) + "\n" for record in records)
        with self._lock, os.fdopen(append_private(self.path), "a", encoding="utf-8") as handle:
            handle.write(lines)


class JsonLinesSpanExporter(SpanExporter):
    """Write finished spans as JSON lines (``{"kind": "span", ...}``)."""

    def __init__(self, sink: JsonLinesFile) -> None:
        self._sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._sink.write(
            [{"record": "span", **json.loads(span.to_json(indent=None))} for span in spans]
        )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class JsonLinesLogExporter(LogRecordExporter):
    """Write log records (the gate's evaluation results) as JSON lines."""

    def __init__(self, sink: JsonLinesFile) -> None:
        self._sink = sink

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        records = []
        for item in batch:
            record = item.log_record
            records.append(
                {
                    "record": "log",
                    "event_name": record.event_name,
                    "trace_id": format(record.trace_id or 0, "032x"),
                    "span_id": format(record.span_id or 0, "016x"),
                    "timestamp": record.timestamp or record.observed_timestamp,
                    "attributes": dict(record.attributes or {}),
                    "body": record.body,
                }
            )
        self._sink.write(records)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class Telemetry:
    """The providers this process installed, to flush at the end of a run."""

    def __init__(self, tracer_provider: TracerProvider, logger_provider: LoggerProvider) -> None:
        self.tracer_provider = tracer_provider
        self.logger_provider = logger_provider

    def flush(self) -> None:
        """Export everything buffered (call before the process exits or suspends)."""
        self.tracer_provider.force_flush()
        self.logger_provider.force_flush()


_installed: Telemetry | None = None
OTLP_TIMEOUT_SECONDS = 5.0


def configure_telemetry(
    file: Path, *, campaign: str, otlp_endpoint: str | None = None
) -> Telemetry:
    """Install the SDK once per process: JSON lines to ``file``, plus OTLP when given."""
    global _installed
    if _installed is not None:
        return _installed
    resource = Resource.create({"service.name": "unattended", "unattended.campaign": campaign})
    sink = JsonLinesFile(file)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(sink)))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(JsonLinesLogExporter(sink)))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = otlp_endpoint.rstrip("/")
        # A collector that is down must not hold the campaign: each export (with its
        # retries) gives up after OTLP_TIMEOUT_SECONDS; the JSON lines still have it all.
        tracer_provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=OTLP_TIMEOUT_SECONDS)
            )
        )
        logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(
                OTLPLogExporter(endpoint=f"{base}/v1/logs", timeout=OTLP_TIMEOUT_SECONDS)
            )
        )
    trace.set_tracer_provider(tracer_provider)
    _logs.set_logger_provider(logger_provider)
    _installed = Telemetry(tracer_provider, logger_provider)
    return _installed

"""Shared test configuration: the run starts from a clean, isolated environment."""

from __future__ import annotations

import os

import pytest

# Variables that would let a test reach the developer's real services or state.
# They are stripped once, when the run starts; session fixtures (a Prefect server
# started for the tests, say) then set their own, and tests use monkeypatch.
_STRIPPED_PREFIXES = ("PREFECT_", "OTEL_", "UNATTENDED_", "OPENAI_")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="run the large reliability tests")


def pytest_configure(config: pytest.Config) -> None:
    for key in list(os.environ):
        if key.startswith(_STRIPPED_PREFIXES):
            del os.environ[key]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="large version; run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


class OTelCapture:
    """The SDK's in-memory span and log exporters, installed as the global providers."""

    def __init__(self) -> None:
        from opentelemetry import _logs, trace
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import (
            InMemoryLogRecordExporter,
            SimpleLogRecordProcessor,
        )
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.spans_exporter = InMemorySpanExporter()
        self.logs_exporter = InMemoryLogRecordExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_exporter))
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs_exporter))
        trace.set_tracer_provider(tracer_provider)
        _logs.set_logger_provider(logger_provider)

    def spans(self):  # -> tuple[ReadableSpan, ...]
        return self.spans_exporter.get_finished_spans()

    def logs(self):  # -> tuple[ReadableLogRecord, ...]
        return self.logs_exporter.get_finished_logs()

    def clear(self) -> None:
        self.spans_exporter.clear()
        self.logs_exporter.clear()


_otel_capture: OTelCapture | None = None


@pytest.fixture
def otel() -> OTelCapture:
    """Capture spans and log records with the SDK (global providers can be set only once)."""
    global _otel_capture
    if _otel_capture is None:
        _otel_capture = OTelCapture()
    _otel_capture.clear()
    return _otel_capture

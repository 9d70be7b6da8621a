"""Cost of ``accept`` per attempt against a hand-written loop doing the same work.

Three cheap checks, three attempts per call (two rejections, then a pass), measured
side by side in one run: first with no OpenTelemetry SDK installed (the API's no-op
providers), then with the SDK and in-memory exporters.

    python benchmarks/accept_overhead.py [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from acceptance import Rejected, accept

ATTEMPTS = 3


def producer(previous):
    return {"x": len(previous) * 2, "n": 4}


def positive(value):
    if value["x"] < 0:
        raise Rejected("negative")


def large_enough(value):
    if value["x"] < 4:
        raise Rejected(f"x={value['x']} is below 4")


def sized(value):
    if value["n"] != 4:
        raise Rejected("wrong size")


CHECKS = (positive, large_enough, sized)


async def by_hand() -> dict:
    """The same work without the gate: produce, check in order, keep the reasons."""
    history: list[tuple[dict, str | None]] = []
    for _ in range(ATTEMPTS):
        value = producer(tuple(history))
        try:
            for check in CHECKS:
                check(value)
        except Rejected as exc:
            history.append((value, exc.reason))
            continue
        return value
    raise RuntimeError("not accepted")


async def gated() -> dict:
    outcome = await accept(producer, checks=CHECKS, attempts=ATTEMPTS, name="bench")
    return outcome.value


async def per_call(fn, calls: int) -> float:
    for _ in range(200):  # warm up
        await fn()
    started = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - started) / calls


def install_sdk() -> None:
    from opentelemetry import _logs, trace
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(InMemoryLogRecordExporter()))
    trace.set_tracer_provider(tracer_provider)
    _logs.set_logger_provider(logger_provider)


async def measure(calls: int) -> None:
    rows = []
    hand = await per_call(by_hand, calls)
    gate = await per_call(gated, calls)
    rows.append(("no SDK", hand, gate, 25.0))
    install_sdk()
    hand_sdk = await per_call(by_hand, calls)
    gate_sdk = await per_call(gated, calls)
    rows.append(("SDK, in-memory", hand_sdk, gate_sdk, 150.0))
    print(
        f"{'provider':<16} {'by hand':>10} {'accept':>10} {'ratio':>7} {'added/attempt':>14} target"
    )
    for label, h, g, target in rows:
        added = (g - h) / ATTEMPTS * 1e6
        verdict = "ok" if added <= target else "OVER"
        print(
            f"{label:<16} {h * 1e6:>8.1f}us {g * 1e6:>8.1f}us {g / h:>6.1f}x "
            f"{added:>11.1f}us  <= {target:.0f}us {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    asyncio.run(measure(args.calls))


if __name__ == "__main__":
    main()

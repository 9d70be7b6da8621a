"""Cost of ``accept`` per attempt against a hand-written loop doing the same work.

Three cheap checks, three attempts per call (two rejections, then a pass). Two sides:
no OpenTelemetry SDK (the API's no-op providers) and the SDK with in-memory exporters.
OpenTelemetry lets a process set its providers once, so each side runs in its own
child process; the children alternate (no SDK, SDK, no SDK, ...) within one run, and
inside each child the hand-written loop and ``accept`` alternate in blocks of calls.
The added cost per attempt is the median over blocks of (accept - by hand) / 3, each
pair measured back to back; the load average is printed beside it.

    python benchmarks/accept_overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
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


async def child(sdk: bool, calls: int, blocks: int) -> dict[str, list[float]]:
    """Measure one side: alternating blocks of the hand-written loop and ``accept``."""
    if sdk:
        install_sdk()
    for _ in range(200):  # warm up both
        await by_hand()
        await gated()
    measured: dict[str, list[float]] = {"hand": [], "gate": []}
    for block in range(blocks):
        order = (("hand", by_hand), ("gate", gated))
        for key, fn in order if block % 2 == 0 else reversed(order):
            measured[key].append(await per_call(fn, calls))
    return measured


SIDES = (("no SDK", False, 25.0), ("SDK, in-memory", True, 150.0))


def measure(calls: int, rounds: int, blocks: int) -> None:
    found: dict[str, dict[str, list[float]]] = {
        label: {"hand": [], "gate": []} for label, _, _ in SIDES
    }
    for index in range(rounds):
        for label, sdk, _ in SIDES if index % 2 == 0 else tuple(reversed(SIDES)):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "sdk" if sdk else "none",
                    "--calls",
                    str(calls),
                    "--blocks",
                    str(blocks),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout)
            for key in ("hand", "gate"):
                found[label][key].extend(result[key])
    print(f"{rounds} child processes per side, alternated; {blocks} blocks of {calls} calls each")
    print(
        f"{'provider':<16} {'by hand':>10} {'accept':>10} {'ratio':>7} {'added/attempt':>14} target"
    )
    for label, _, target in SIDES:
        hand, gate = found[label]["hand"], found[label]["gate"]
        added = statistics.median((g - h) / ATTEMPTS for g, h in zip(gate, hand, strict=True))
        h, g = statistics.median(hand), statistics.median(gate)
        verdict = "ok" if added * 1e6 <= target else "OVER"
        print(
            f"{label:<16} {h * 1e6:>8.1f}us {g * 1e6:>8.1f}us {g / h:>6.1f}x "
            f"{added * 1e6:>11.1f}us  <= {target:.0f}us {verdict}"
        )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per block")
    parser.add_argument("--rounds", type=int, default=4, help="child processes per side")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per child and kind")
    parser.add_argument("--child", choices=("none", "sdk"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child == "sdk", args.calls, args.blocks))))
        return
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    measure(args.calls, args.rounds, args.blocks)


if __name__ == "__main__":
    main()

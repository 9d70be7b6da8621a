"""Time ``Policy.decide_and_count`` with 20 rules (CEL and Python) on one round context.

Run: ``.venv/bin/python benchmarks/policy_eval.py [N]``. Prints microseconds per
evaluation for three policies measured side by side in one run, and their
ratios to the 1 ms target:

* ``mixed``: 14 CEL rules on scalar fields + 6 Python rules (the usual case);
* ``mixed+candidates``: the same with one CEL rule that reads ``batch.candidates``
  (the candidates are then converted for CEL on every evaluation);
* ``mixed, firing``: ``mixed`` on a costlier batch near the end of the
  allocation, so several rules of different severities fire every time;
* ``python-only``: 20 Python rules, no CEL context at all.
"""

from __future__ import annotations

import random
import sys
import time

from policies import BatchSummary, Policy, RoundContext, Rule, Severity, proposal_key

CEL_CONDITIONS = [
    "batch.node_hours > 64.0 && round.index >= 2",
    "batch.size > 512",
    "budget.remaining < batch.node_hours",
    "budget.spent > 10000.0",
    "allocation.has_walltime && allocation.walltime_remaining < 900.0",
    "gate.disposition == 'fallback' && gate.consecutive_fallbacks >= 3",
    "round.attempt > 5",
    "history.decisions.exists(d, d == 'suspend')",
    "size(history.decisions) > 1000",
    "campaign.name == 'forbidden'",
    "batch.node_hours / double(batch.size) > 8.0",
    "round.index > 500",
    "budget.remaining < 0.0",
    "batch.node_hours > 2.0 * budget.remaining",
]
SEVERITIES = list(Severity)


def python_rules(count: int) -> list[Rule]:
    checks = [
        lambda c: c.batch.node_hours > 1e6,
        lambda c: "too many rounds" if c.round_index > 10_000 else None,
        lambda c: c.budget_spent < 0,
        lambda c: c.attempt > 50,
        lambda c: c.consecutive_fallbacks > 99,
        lambda c: len(c.earlier_decisions) > 10_000,
    ]
    return [
        Rule(name=f"py-{i}", when=checks[i % len(checks)], severity=SEVERITIES[i % 6])
        for i in range(count)
    ]


def cel_rules(conditions: list[str]) -> list[Rule]:
    return [
        Rule(name=f"cel-{i}", when=when, severity=SEVERITIES[i % 6], approvers=("alice",))
        for i, when in enumerate(conditions)
    ]


def context() -> RoundContext:
    rng = random.Random(7)
    candidates = [[rng.random() for _ in range(8)] for _ in range(64)]
    return RoundContext(
        campaign="bench",
        round_index=3,
        attempt=1,
        batch=BatchSummary(size=64, candidates=candidates, node_hours=3.5),
        proposal_key=proposal_key(candidates),
        disposition="accepted",
        consecutive_fallbacks=0,
        budget_spent=120.0,
        budget_remaining=880.0,
        walltime_remaining=7200.0,
        earlier_decisions=("continue", "retry", "continue"),
    )


def per_evaluation_us(policy: Policy, ctx: RoundContext, n: int) -> float:
    """Return the best of three runs of ``n`` evaluations, in µs per evaluation."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            policy.decide_and_count(ctx)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ctx = context()
    with_candidates = [*CEL_CONDITIONS[:-1], "batch.candidates.exists(c, c[0] > 2.0)"]
    costly = ctx.model_copy(
        update={
            "batch": ctx.batch.model_copy(update={"node_hours": 900.0}),
            "walltime_remaining": 600.0,
        }
    )
    policies = {
        "mixed": (Policy([*cel_rules(CEL_CONDITIONS), *python_rules(6)]), ctx),
        "mixed+candidates": (Policy([*cel_rules(with_candidates), *python_rules(6)]), ctx),
        "mixed, firing": (Policy([*cel_rules(CEL_CONDITIONS), *python_rules(6)]), costly),
        "python-only": (Policy(python_rules(20)), ctx),
    }
    fired = {name: len(p.decide_and_count(c).fired) for name, (p, c) in policies.items()}
    print(f"20 rules, {n} evaluations each, 64 candidates x 8 dims, best of 3")
    baseline = None
    for name, (policy, round_ctx) in policies.items():
        us = per_evaluation_us(policy, round_ctx, n)
        baseline = baseline or us
        print(
            f"{name:>18}: {us:8.1f} µs/evaluation  "
            f"({us / 1000.0:.3f} of the 1 ms target, x{us / baseline:.2f} of mixed, "
            f"{fired[name]} rule(s) fired)"
        )


if __name__ == "__main__":
    main()

"""The deterministic fallback: surrogate batch, evenly spaced lattice, or stop."""

from __future__ import annotations

import json

import numpy as np
import pytest

from acceptance import Rejected, accept
from policies import FallbackUnavailable
from tasks import (
    Bounds,
    FallbackBatch,
    GaussianProcess,
    Proposal,
    candidates_hash,
    evenly_spaced,
    fallback_batch,
    planner_checks,
)
from tasks.demo import objective

UNIT2 = Bounds.unit(2)


def _trained() -> GaussianProcess:
    rng = np.random.default_rng(1)
    points = rng.random((20, 2)).tolist()
    model = GaussianProcess()
    model.assimilate(points, [objective(p) for p in points])
    return model


def _refuse_everything(value: object) -> None:
    raise Rejected("no")


class TestFallbackBatch:
    def test_uses_the_surrogate_batch_when_it_passes(self) -> None:
        batch = fallback_batch(_trained(), UNIT2, 8, seed=4)
        assert batch.source == "surrogate"
        assert batch.degraded_by is None
        assert [list(c) for c in batch.candidates] == _trained().propose(8, UNIT2, 4)

    def test_same_inputs_give_the_same_batch_and_hash(self) -> None:
        first = fallback_batch(_trained(), UNIT2, 8, seed=4)
        second = fallback_batch(_trained(), UNIT2, 8, seed=4)
        assert first == second
        assert first.content_hash == candidates_hash(first.candidates)

    def test_another_seed_gives_another_hash(self) -> None:
        first = fallback_batch(_trained(), UNIT2, 8, seed=4)
        assert fallback_batch(_trained(), UNIT2, 8, seed=5).content_hash != first.content_hash

    def test_without_data_it_is_the_latin_hypercube(self) -> None:
        batch = fallback_batch(GaussianProcess(), UNIT2, 8, seed=0)
        assert batch.source == "surrogate"
        assert len(batch.candidates) == 8

    def test_degrades_to_the_lattice_when_the_surrogate_batch_is_rejected(self) -> None:
        def not_the_surrogate(value: Proposal) -> None:
            if value.candidates == _trained().propose(8, UNIT2, 4):
                raise Rejected("too close to the last round")

        checks = [*planner_checks(UNIT2, 8), not_the_surrogate]
        batch = fallback_batch(_trained(), UNIT2, 8, seed=4, checks=checks)
        assert batch.source == "grid"
        assert batch.degraded_by == "not_the_surrogate: too close to the last round"
        assert [list(c) for c in batch.candidates] == evenly_spaced(UNIT2, 8, 4)

    def test_degrades_when_the_surrogate_gives_too_few_points(self) -> None:
        # Eleven values fit in [0, 1e-9] at 10 digits: a random pool of six
        # repeats one, so the surrogate's batch comes up short, while the
        # lattice's even spacing still finds six.
        bounds = Bounds(lower=(0.0,), upper=(1e-9,))
        model = GaussianProcess(pool_size=1, length_scale=1.0)
        model.assimilate([[5e-10]], [1.0])
        batch = fallback_batch(model, bounds, 6, seed=0)
        assert batch.source == "grid"
        assert batch.degraded_by == "batch_size: 5 candidates; the batch takes exactly 6"

    def test_narrow_bounds_make_the_fallback_unavailable(self) -> None:
        narrow = Bounds(lower=(0.0, 0.0), upper=(1e-12, 1e-12))
        with pytest.raises(FallbackUnavailable, match="lattice was rejected by distinct") as caught:
            fallback_batch(GaussianProcess(), narrow, 8, seed=0)
        assert caught.value.code == "fallback_unavailable"
        assert caught.value.details["count"] == 8

    def test_count_below_one_is_unavailable(self) -> None:
        with pytest.raises(FallbackUnavailable, match="batch size must be at least 1"):
            fallback_batch(GaussianProcess(), UNIT2, 0, seed=0)

    def test_dimension_mismatch_is_unavailable(self) -> None:
        with pytest.raises(FallbackUnavailable, match="surrogate has 2 coordinates"):
            fallback_batch(_trained(), Bounds.unit(3), 4, seed=0)

    def test_checks_rejecting_everything_make_it_unavailable(self) -> None:
        with pytest.raises(FallbackUnavailable, match="_refuse_everything: no"):
            fallback_batch(_trained(), UNIT2, 4, seed=0, checks=[_refuse_everything])

    def test_async_checks_are_refused(self) -> None:
        async def later(value: object) -> None:
            return None

        with pytest.raises(TypeError, match="synchronous"):
            fallback_batch(_trained(), UNIT2, 4, seed=0, checks=[later])

    def test_a_campaign_checkpointed_with_a_version_one_surrogate_gets_the_same_batch(
        self,
    ) -> None:
        """A campaign resumed across the surrogate upgrade still builds its fallback first."""
        state = _trained().to_state()
        state["version"] = 1
        state["settings"] = {"length_scale": None, "noise": 1e-6, "kappa": 2.0, "pool_size": 1024}
        first = fallback_batch(GaussianProcess.from_state(state), UNIT2, 8, seed=4)
        again = fallback_batch(GaussianProcess.from_state(state), UNIT2, 8, seed=4)
        assert first.source == "surrogate"
        assert first == again
        assert first == fallback_batch(_trained(), UNIT2, 8, seed=4)

    def test_batch_serialises_to_json_and_back(self) -> None:
        batch = fallback_batch(_trained(), UNIT2, 8, seed=4)
        assert FallbackBatch.model_validate_json(batch.model_dump_json()) == batch
        assert json.loads(batch.model_dump_json())["source"] == "surrogate"

    @pytest.mark.asyncio
    async def test_gate_falls_back_to_the_batch(self) -> None:
        batch = fallback_batch(_trained(), UNIT2, 8, seed=4)

        async def refuses(previous: tuple[object, ...]) -> Proposal:
            raise Rejected("the model refused", check="refusal")

        outcome = await accept(
            refuses,
            checks=planner_checks(UNIT2, 8),
            attempts=2,
            fallback=batch.to_proposal,
            name="planner",
        )
        assert outcome.disposition == "fallback"
        assert candidates_hash(outcome.value.candidates) == batch.content_hash


class TestEvenlySpaced:
    @pytest.mark.parametrize("dim", [1, 2, 5])
    @pytest.mark.parametrize("count", [1, 7, 64])
    def test_lattice_passes_the_checks(self, dim: int, count: int) -> None:
        bounds = Bounds(lower=(-1.0,) * dim, upper=(3.0,) * dim)
        points = evenly_spaced(bounds, count, seed=11)
        for check in planner_checks(bounds, count):
            check(points)

    def test_lattice_spreads_over_every_axis(self) -> None:
        points = np.array(evenly_spaced(UNIT2, 64, seed=0))
        for axis in range(2):
            counts = np.histogram(points[:, axis], bins=4, range=(0, 1))[0]
            assert counts.min() >= 12

    def test_seed_moves_the_lattice(self) -> None:
        assert evenly_spaced(UNIT2, 8, 0) != evenly_spaced(UNIT2, 8, 1)

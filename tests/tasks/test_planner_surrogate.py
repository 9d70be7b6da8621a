"""``SurrogatePlanner`` as an accept producer."""

from __future__ import annotations

import numpy as np
import pytest

from acceptance import Rejected, accept
from tasks import Bounds, GaussianProcess, Proposal, SurrogatePlanner, planner_checks
from tasks.demo import objective

UNIT2 = Bounds.unit(2)


def _trained() -> GaussianProcess:
    rng = np.random.default_rng(7)
    points = rng.random((16, 2)).tolist()
    model = GaussianProcess()
    model.assimilate(points, [objective(p) for p in points])
    return model


class TestSurrogatePlanner:
    @pytest.mark.asyncio
    async def test_first_attempt_is_the_surrogate_batch_for_the_seed(self) -> None:
        proposal = await SurrogatePlanner(_trained(), UNIT2, 8, seed=3)(())
        assert proposal.candidates == _trained().propose(8, UNIT2, 3)
        assert proposal.rationale.startswith("expected improvement over 1024 candidates")

    @pytest.mark.asyncio
    async def test_the_rationale_names_the_lower_confidence_bound_when_chosen(self) -> None:
        model = GaussianProcess(acquisition="lcb", kappa=1.5)
        model.assimilate([[0.1, 0.1], [0.6, 0.4]], [2.0, 1.0])
        proposal = await SurrogatePlanner(model, UNIT2, 4, seed=0)(())
        assert proposal.rationale.startswith("lower confidence bound (kappa=1.5)")

    @pytest.mark.asyncio
    async def test_without_data_it_says_latin_hypercube(self) -> None:
        proposal = await SurrogatePlanner(GaussianProcess(), UNIT2, 4, seed=0)(())
        assert proposal.rationale.startswith("Latin hypercube")

    @pytest.mark.asyncio
    async def test_a_reask_proposes_a_different_batch(self) -> None:
        batches: list[list[list[float]]] = []

        def never_twice(value: Proposal) -> None:
            batches.append(value.candidates)
            raise Rejected("try elsewhere")

        with pytest.raises(Exception, match="no value accepted in 3"):
            await accept(
                SurrogatePlanner(_trained(), UNIT2, 8, seed=3),
                checks=[never_twice],
                attempts=3,
                name="planner",
            )
        assert len(batches) == 3
        assert batches[0] != batches[1] != batches[2] != batches[0]

    @pytest.mark.asyncio
    async def test_same_seed_and_history_give_the_same_batch(self) -> None:
        first = await SurrogatePlanner(_trained(), UNIT2, 8, seed=3)(())
        second = await SurrogatePlanner(_trained(), UNIT2, 8, seed=3)(())
        assert first == second

    @pytest.mark.asyncio
    async def test_its_batches_pass_the_planner_checks(self) -> None:
        outcome = await accept(
            SurrogatePlanner(_trained(), UNIT2, 8, seed=1),
            checks=planner_checks(UNIT2, 8),
            name="planner",
        )
        assert outcome.disposition == "accepted"

    @pytest.mark.parametrize(("count", "seed"), [(0, 1), (1, -1)])
    def test_bad_arguments_are_refused(self, count: int, seed: int) -> None:
        with pytest.raises(ValueError, match="must be"):
            SurrogatePlanner(GaussianProcess(), UNIT2, count, seed)

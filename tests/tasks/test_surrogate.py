"""The Gaussian-process surrogate: fit, predict, propose, state round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tasks import Bounds, GaussianProcess, planner_checks
from tasks.demo import minimiser, objective

UNIT2 = Bounds.unit(2)


def _trained(n: int = 24, seed: int = 0, **settings: float) -> GaussianProcess:
    rng = np.random.default_rng(seed)
    points = rng.random((n, 2)).tolist()
    model = GaussianProcess(**settings)  # type: ignore[arg-type]  # test settings
    model.assimilate(points, [objective(p) for p in points])
    return model


class TestSettings:
    @pytest.mark.parametrize(
        ("setting", "value"),
        [("length_scale", 0.0), ("noise", -1.0), ("kappa", math.nan), ("pool_size", 0)],
    )
    def test_bad_settings_are_refused_by_name(self, setting: str, value: float) -> None:
        with pytest.raises(ValueError, match=setting):
            GaussianProcess(**{setting: value})  # type: ignore[arg-type]  # deliberately bad


class TestAssimilate:
    def test_non_finite_values_are_skipped_and_counted(self) -> None:
        model = GaussianProcess()
        skipped = model.assimilate([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]], [1.0, math.nan, math.inf])
        assert skipped == 2
        assert model.skipped == 2
        assert model.observations == 1

    def test_non_finite_coordinates_are_refused_by_index(self) -> None:
        model = GaussianProcess()
        with pytest.raises(ValueError, match="point 1 has a non-finite coordinate"):
            model.assimilate([[0.1, 0.1], [math.nan, 0.2]], [1.0, 2.0])

    def test_dimension_mismatch_is_refused(self) -> None:
        model = _trained(4)
        with pytest.raises(ValueError, match="points have 3 coordinates; the surrogate has 2"):
            model.assimilate([[0.1, 0.1, 0.1]], [1.0])

    def test_lengths_must_match(self) -> None:
        with pytest.raises(ValueError, match="2 points but 1 values"):
            GaussianProcess().assimilate([[0.1], [0.2]], [1.0])

    def test_duplicate_points_do_not_break_the_fit(self) -> None:
        model = GaussianProcess(noise=1e-12)
        model.assimilate([[0.5, 0.5]] * 5 + [[0.1, 0.2]], [1.0] * 5 + [2.0])
        mean, std = model.predict([[0.5, 0.5]])
        assert np.isfinite(mean).all()
        assert np.isfinite(std).all()


class TestPredict:
    def test_prior_without_data_is_zero_mean_unit_std(self) -> None:
        mean, std = GaussianProcess().predict([[0.1, 0.2], [0.3, 0.4]])
        assert mean.tolist() == [0.0, 0.0]
        assert std.tolist() == [1.0, 1.0]

    def test_interpolates_observed_points(self) -> None:
        model = _trained(16)
        points = model.to_state()["points"][:3]
        mean, std = model.predict(points)
        expected = [objective(p) for p in points]
        assert np.allclose(mean, expected, atol=1e-2)
        assert (std < 0.05 * np.std(model.to_state()["values"])).all()

    def test_uncertainty_grows_away_from_data(self) -> None:
        model = GaussianProcess(length_scale=0.1)
        model.assimilate([[0.1, 0.1], [0.15, 0.1]], [1.0, 2.0])
        _, std = model.predict([[0.12, 0.1], [0.9, 0.9]])
        assert std[0] < std[1]


class TestPropose:
    def test_without_data_it_is_a_latin_hypercube(self) -> None:
        batch = np.array(GaussianProcess().propose(8, UNIT2, seed=3))
        for axis in range(2):
            strata = np.floor(batch[:, axis] * 8).astype(int)
            assert sorted(strata.tolist()) == list(range(8))

    def test_same_seed_gives_bit_identical_batches(self) -> None:
        first = _trained().propose(8, UNIT2, seed=5)
        second = _trained().propose(8, UNIT2, seed=5)
        assert json.dumps(first) == json.dumps(second)

    def test_different_seeds_give_different_batches(self) -> None:
        model = _trained()
        assert model.propose(8, UNIT2, seed=5) != model.propose(8, UNIT2, seed=6)

    def test_batch_passes_the_planner_checks(self) -> None:
        bounds = Bounds(lower=(-2.0, 10.0), upper=(3.0, 11.0))
        batch = GaussianProcess().propose(8, bounds, seed=1)
        for check in planner_checks(bounds, 8):
            check(batch)
        trained = GaussianProcess()
        trained.assimilate(batch, [sum(x) for x in batch])
        batch = trained.propose(8, bounds, seed=1)
        for check in planner_checks(bounds, 8):
            check(batch)

    def test_proposals_move_towards_the_minimum(self) -> None:
        model = _trained(40)
        best_seen = min(model.to_state()["values"])
        batch = model.propose(8, UNIT2, seed=2)
        target = np.array(minimiser(2))
        closest = min(float(np.linalg.norm(np.array(p) - target)) for p in batch)
        assert closest < 0.1
        assert min(objective(p) for p in batch) < best_seen

    def test_the_batch_leaves_out_observed_points(self) -> None:
        # Bounds this narrow round every pool point onto the observed one.
        narrow = Bounds(lower=(0.0, 0.0), upper=(1e-12, 1e-12))
        model = GaussianProcess(pool_size=16)
        model.assimilate([[0.0, 0.0]], [1.0])
        assert model.propose(4, narrow, seed=0) == []

    def test_the_batch_has_no_repeats_within_itself(self) -> None:
        narrow = Bounds(lower=(0.0,), upper=(2e-10,))
        model = GaussianProcess(pool_size=64)
        model.assimilate([[1e-10]], [1.0])
        batch = model.propose(4, narrow, seed=0)
        assert sorted(round(p[0], 10) for p in batch) == [0.0, 2e-10]

    def test_batch_equals_refitting_after_each_believed_pick(self) -> None:
        from tasks._surrogate import _Fit  # the reference computation refits by hand

        model = _trained(30, pool_size=256)
        fast = model.propose(6, UNIT2, seed=4)
        pool = np.random.default_rng(4).random((256, 2))
        fit = model._fit()
        x, y = model._points, model._standardised()
        chosen: list[list[float]] = []
        available = np.ones(len(pool), dtype=bool)
        while len(chosen) < 6:
            refit = _Fit(x, y, fit.length, model.noise)
            mean, rows = refit.mean(pool), refit.whitened(pool)
            std = np.sqrt(np.clip(1.0 - (rows * rows).sum(0), 1e-12, None))
            index = int(np.argmin(np.where(available, mean - model.kappa * std, np.inf)))
            available[index] = False
            chosen.append(pool[index].tolist())
            x, y = np.vstack([x, pool[index]]), np.append(y, mean[index])
        assert fast == chosen

    def test_new_observations_change_the_next_batch(self) -> None:
        model = _trained(10)
        before = model.propose(4, UNIT2, seed=0)
        model.assimilate([[0.9, 0.9]], [-5.0])
        assert model.propose(4, UNIT2, seed=0) != before

    def test_count_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="count must be at least 1"):
            GaussianProcess().propose(0, UNIT2, seed=0)

    def test_bounds_of_another_dimension_are_refused(self) -> None:
        with pytest.raises(ValueError, match="bounds have 3 coordinates"):
            _trained(4).propose(2, Bounds.unit(3), seed=0)

    def test_negative_seed_is_refused(self) -> None:
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            GaussianProcess().propose(2, UNIT2, seed=-1)


class TestState:
    def test_state_is_plain_json(self) -> None:
        state = _trained(5).to_state()
        assert json.loads(json.dumps(state, allow_nan=False)) == state
        assert state["settings"] == {
            "length_scale": None,
            "noise": 1e-6,
            "kappa": 2.0,
            "pool_size": 2048,
        }

    def test_round_trip_keeps_proposals_bit_identical(self) -> None:
        model = _trained(12, length_scale=0.3, kappa=1.5)
        model.assimilate([[0.2, 0.2]], [math.nan])
        restored = GaussianProcess.from_state(json.loads(json.dumps(model.to_state())))
        assert restored.to_state() == model.to_state()
        assert restored.propose(8, UNIT2, seed=9) == model.propose(8, UNIT2, seed=9)

    def test_empty_state_round_trips(self) -> None:
        restored = GaussianProcess.from_state(GaussianProcess().to_state())
        assert restored.observations == 0

    def test_wrong_kind_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"state.kind/version"):
            GaussianProcess.from_state({"kind": "forest", "version": 1})

    def test_missing_setting_is_named(self) -> None:
        state = _trained(3).to_state()
        del state["settings"]["kappa"]
        with pytest.raises(ValueError, match=r"state\.settings: missing or invalid kappa"):
            GaussianProcess.from_state(state)

    def test_stored_nan_value_is_refused(self) -> None:
        state = _trained(3).to_state()
        state["values"][0] = math.nan
        with pytest.raises(ValueError, match=r"state\.values"):
            GaussianProcess.from_state(state)

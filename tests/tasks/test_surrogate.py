"""The Gaussian-process surrogate: fit, predict, propose, quality, state round trip."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest

import tasks._acquisition
from tasks import Bounds, GaussianProcess, planner_checks
from tasks._acquisition import Scorer, believer_batch, escape_region
from tasks._gp import Hyperparameters, Posterior, _negative_log_posterior, matern52, minimise
from tasks._surrogate_model import fit_basis
from tasks.demo import minimiser, objective

UNIT2 = Bounds.unit(2)


def _trained(n: int = 24, seed: int = 0, **settings: Any) -> GaussianProcess:
    rng = np.random.default_rng(seed)
    points = rng.random((n, 2)).tolist()
    model = GaussianProcess(**settings)
    model.assimilate(points, [objective(p) for p in points])
    return model


def _campaign(seed: int, rounds: int = 5, batch: int = 4) -> float:
    """Run ``rounds`` rounds on the demo objective; return the best point's distance."""
    model = GaussianProcess()
    for index in range(rounds):
        candidates = model.propose(batch, UNIT2, [seed, index])
        model.assimilate(candidates, [objective(p) for p in candidates])
    state = model.to_state()
    best = state["points"][int(np.argmin(state["values"]))]
    return float(np.linalg.norm(np.array(best) - np.array(minimiser(2))))


def _rosenbrock(x: list[float]) -> float:
    """Rosenbrock's valley; minimum 0 at (1, ..., 1)."""
    return sum(100 * (b - a * a) ** 2 + (1 - a) ** 2 for a, b in itertools.pairwise(x))


def _best_of_campaign(function: Any, bounds: Bounds, seed: int, rounds: int) -> float:
    """Run ``rounds`` rounds of four on ``function``; return the lowest value found."""
    model = GaussianProcess()
    best = math.inf
    for index in range(rounds):
        candidates = model.propose(4, bounds, [seed, index])
        values = [function(p) for p in candidates]
        model.assimilate(candidates, values)
        best = min(best, *values)
    return best


_H3_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
_H3_P = 1e-4 * np.array(
    [[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]
)
_H3_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_H3_MINIMUM = -3.86278


def _hartmann3(x: list[float]) -> float:
    """Hartmann 3-D on [0, 1]^3: global minimum -3.86278, a local one at -3.09."""
    z = np.asarray(x, dtype=float)
    return float(-np.sum(_H3_ALPHA * np.exp(-np.sum(_H3_A * (z - _H3_P) ** 2, axis=1))))


def _random_search(seed: int, count: int) -> float:
    points = np.random.default_rng(seed).random((count, 2))
    best = points[int(np.argmin([objective(p.tolist()) for p in points]))]
    return float(np.linalg.norm(best - np.array(minimiser(2))))


class TestSettings:
    @pytest.mark.parametrize(
        ("setting", "value"),
        [
            ("length_scale", 0.0),
            ("noise", -1.0),
            ("noise", 1.0),
            ("kappa", math.nan),
            ("pool_size", 0),
            ("acquisition", "pi"),
            ("max_points", 4),
        ],
    )
    def test_bad_settings_are_refused_by_name(self, setting: str, value: Any) -> None:
        with pytest.raises(ValueError, match=setting):
            GaussianProcess(**{setting: value})


class TestAssimilate:
    def test_non_finite_values_are_skipped_and_counted(self) -> None:
        model = GaussianProcess()
        skipped = model.assimilate([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]], [1.0, math.nan, math.inf])
        assert skipped == 2
        assert model.skipped == 2
        assert model.observations == 1

    def test_a_skipped_point_is_not_held_back_from_later_batches(self) -> None:
        model = GaussianProcess(pool_size=64)
        narrow = Bounds(lower=(0.0,), upper=(1e-10,))
        model.assimilate([[0.0], [1e-10]], [1.0, math.nan])
        assert [round(p[0], 10) for p in model.propose(2, narrow, seed=0)] == [1e-10]

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

    def test_a_fixed_length_scale_interpolates_observed_points(self) -> None:
        model = _trained(16, length_scale=0.2)
        points = model.to_state()["points"][:3]
        mean, std = model.predict(points)
        assert np.allclose(mean, [objective(p) for p in points], atol=1e-2)
        assert (std < 0.05 * np.std(model.to_state()["values"])).all()

    def test_the_fitted_model_interpolates_a_smooth_function(self) -> None:
        rng = np.random.default_rng(0)
        points = rng.random((16, 2)).tolist()
        values = [(x - 0.3) ** 2 + 0.5 * (y - 0.6) ** 2 for x, y in points]
        model = GaussianProcess()
        model.assimilate(points, values)
        mean, _ = model.predict(points)
        assert np.allclose(mean, values, atol=1e-3 * float(np.ptp(values)))

    def test_uncertainty_grows_away_from_data(self) -> None:
        model = GaussianProcess(length_scale=0.1)
        model.assimilate([[0.1, 0.1], [0.15, 0.1]], [1.0, 2.0])
        _, std = model.predict([[0.12, 0.1], [0.9, 0.9]])
        assert std[0] < std[1]

    def test_far_from_data_it_expects_the_worst_value_seen(self) -> None:
        model = GaussianProcess(length_scale=0.05)
        model.assimilate([[0.1, 0.1], [0.2, 0.1], [0.1, 0.2]], [1.0, 3.0, 2.0])
        mean, _ = model.predict([[0.9, 0.9]])
        assert mean[0] == pytest.approx(3.0)


class TestFit:
    def test_each_dimension_gets_its_own_length_scale(self) -> None:
        rng = np.random.default_rng(1)
        points = rng.random((30, 2)).tolist()
        model = GaussianProcess()
        model.assimilate(points, [math.sin(6.0 * x) for x, _ in points])
        scales = model.fitted_length_scales
        assert scales is not None
        assert scales[1] > 5 * scales[0]  # the value does not depend on the second coordinate
        assert model.fitted_length_scale == pytest.approx(math.sqrt(scales[0] * scales[1]))

    def test_no_data_has_no_length_scale(self) -> None:
        assert GaussianProcess().fitted_length_scales is None
        assert GaussianProcess().fitted_length_scale is None

    def test_the_likelihood_gradient_matches_finite_differences(self) -> None:
        rng = np.random.default_rng(3)
        x = rng.random((12, 3))
        y = np.array([objective(p.tolist()) for p in x])
        y = (y - y.mean()) / y.std()
        gaps = (x[:, None, :] - x[None, :, :]) ** 2
        theta = np.array([-1.0, 0.3, -0.2, math.log(1e-2)])
        _, gradient = _negative_log_posterior(theta, gaps, y, 1e-6)
        step = 1e-6
        numeric = [
            (
                _negative_log_posterior(theta + e, gaps, y, 1e-6)[0]
                - _negative_log_posterior(theta - e, gaps, y, 1e-6)[0]
            )
            / (2 * step)
            for e in np.eye(4) * step
        ]
        assert np.allclose(gradient, numeric, rtol=1e-4, atol=1e-5)

    def test_the_optimiser_finds_a_box_constrained_minimum(self) -> None:
        def bowl(x: Any) -> tuple[float, Any]:
            centre = np.array([3.0, -1.0])
            return float(((x - centre) ** 2).sum()), 2 * (x - centre)

        x, value = minimise(bowl, np.zeros(2), np.array([-2.0, -2.0]), np.array([2.0, 2.0]), 40)
        assert x.tolist() == pytest.approx([2.0, -1.0], abs=1e-6)
        assert value == pytest.approx(1.0, abs=1e-6)

    def test_the_refit_schedule_grows_by_a_quarter_after_32(self) -> None:
        assert [fit_basis(n) for n in (1, 31, 32, 39, 40, 49, 50, 2000)] == [
            1,
            31,
            32,
            32,
            40,
            40,
            50,
            1722,
        ]


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
        """The rank-1 believer update gives the picks a refit with each believed point gives.

        The reference refits the GP from scratch after every pick (a new Cholesky
        factor over the data and the believed points) and scores with the refit's own
        mean and correlation. Only the signal variance is the first fit's: the believer
        keeps it (a refit would profile it again from believed values, which are no
        data).
        """
        rng = np.random.default_rng(4)
        x = rng.random((20, 2))
        y = np.array([objective(p.tolist()) for p in x])
        y = (y - y.max()) / y.std()
        hyper = Hyperparameters(np.array([0.3, 0.4]), 1e-4)
        posterior = Posterior(x, y, hyper, 1e-6)
        pool = rng.random((256, 2))
        score = Scorer("ei", 2.0)
        fast = believer_batch(posterior, pool, pool, posterior.cross(pool), 6, score, set())

        points, values, chosen = x, y, []
        available = np.ones(len(pool), dtype=bool)
        best = posterior.best
        first_mean, _ = posterior.mean_and_std(pool)
        while len(chosen) < 6:
            refit = Posterior(points, values, hyper, 1e-6)
            mean, refit_std = refit.mean_and_std(pool)
            # A point believed at its mean leaves the mean where it was.
            np.testing.assert_allclose(mean, first_mean, atol=1e-6)
            std = refit_std * np.sqrt(posterior.variance / refit.variance)
            index = int(np.argmin(np.where(available, score(mean, std, best), np.inf)))
            available[index] = False
            chosen.append(pool[index].tolist())
            best = min(best, float(mean[index]))
            points = np.vstack([points, pool[index]])
            values = np.append(values, mean[index])
        assert fast.tolist() == chosen

    @pytest.mark.parametrize("case", range(12))
    def test_rescoring_only_what_could_win_picks_what_rescoring_everything_picks(
        self, case: int
    ) -> None:
        """Each pick rescores a few pool points (scores only get worse); the picks are the
        ones a loop that rescores the whole pool after every pick makes."""
        rng = np.random.default_rng(case)
        dim, count = (1, 2, 3, 6)[case % 4], (1, 2, 8, 64)[case // 3 % 4]
        x = rng.random((int(rng.integers(4, 90)), dim))
        y = np.sin(4 * x).sum(1) + ((x - 0.3) ** 2).sum(1)
        y = (y - y.mean()) / y.std()
        hyper = Hyperparameters(rng.uniform(0.1, 0.6, dim), 1e-4)
        posterior = Posterior(x, y, hyper, 1e-6)
        pool = np.vstack([rng.random((400, dim)), x[0] + rng.normal(0, 0.01, (400, dim))])
        score = Scorer("lcb" if case % 2 else "ei", 2.0)
        taken = {tasks._acquisition.point_key(p) for p in pool[::97]}  # some already observed
        fast = believer_batch(posterior, pool, pool, posterior.cross(pool), count, score, taken)
        assert fast.tolist() == _rescore_everything(posterior, pool, count, score, taken)

    def test_a_basin_that_holds_the_batch_lets_its_last_pick_escape(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Hartmann 3-D, seed 4: by round 7 expected improvement keeps the batch in a local basin.

        Without the escape (the cluster radius set to 0) all four picks land within
        0.05 length scales of each other at the local minimum (-3.09); with it the
        first three are the same and the last goes at least one length scale away.
        """
        monkeypatch.setattr(tasks._acquisition, "_CLUSTER_RADIUS", 0.0)
        model = GaussianProcess()
        unit3 = Bounds.unit(3)
        for index in range(7):
            batch = model.propose(4, unit3, [4, index])
            model.assimilate(batch, [_hartmann3(p) for p in batch])
        scales = np.array(model.fitted_length_scales)
        trapped = np.array(model.propose(4, unit3, [4, 7]))
        assert np.linalg.norm((trapped - trapped[0]) / scales, axis=1).max() < 0.05
        assert max(_hartmann3(p) for p in trapped.tolist()) < -3.08
        monkeypatch.undo()
        escaped = np.array(model.propose(4, unit3, [4, 7]))
        assert escaped[:3].tolist() == trapped[:3].tolist()
        assert np.linalg.norm((escaped[3] - escaped[0]) / scales) >= 1.0

    def test_only_a_clustered_batch_escapes(self) -> None:
        unit_pool = np.array([[0.0, 0.0], [0.01, 0.0], [0.0, 0.02], [0.5, 0.5], [1.0, 0.2]])
        assert escape_region(unit_pool, [0, 1], 2).tolist() == [False, False, False, False, True]
        # Picks spread wider than the radius: no escape.
        assert not escape_region(unit_pool, [0, 3], 1).any()
        # One pick so far (a batch of two): the acquisition's next pick is weighed with it.
        assert escape_region(unit_pool, [0], 1)[4]
        assert not escape_region(unit_pool, [0], 3).any()

    def test_new_observations_change_the_next_batch(self) -> None:
        model = _trained(10)
        before = model.propose(4, UNIT2, seed=0)
        model.assimilate([[0.9, 0.9]], [-5.0])
        assert model.propose(4, UNIT2, seed=0) != before

    def test_the_lower_confidence_bound_is_available(self) -> None:
        batch = _trained(acquisition="lcb", kappa=1.0).propose(4, UNIT2, seed=0)
        for check in planner_checks(UNIT2, 4):
            check(batch)
        assert batch != _trained().propose(4, UNIT2, seed=0)

    def test_past_max_points_the_batch_stays_near_the_best_point(self) -> None:
        model = _trained(300, max_points=64)
        state = model.to_state()
        best = np.array(state["points"][int(np.argmin(state["values"]))])
        batch = np.array(model.propose(8, UNIT2, seed=1))
        assert len(batch) == 8
        assert np.median(np.linalg.norm(batch - best, axis=1)) < 0.1

    def test_count_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="count must be at least 1"):
            GaussianProcess().propose(0, UNIT2, seed=0)

    def test_bounds_of_another_dimension_are_refused(self) -> None:
        with pytest.raises(ValueError, match="bounds have 3 coordinates"):
            _trained(4).propose(2, Bounds.unit(3), seed=0)

    def test_negative_seed_is_refused(self) -> None:
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            GaussianProcess().propose(2, UNIT2, seed=-1)


class TestQuality:
    def test_twenty_simulations_beat_random_search_on_the_demo(self) -> None:
        """Five rounds of four: median distance to the minimiser over seeds 0-9.

        The benchmark (benchmarks/surrogate.py) measured 0.0020 here; random
        search with the same budget gets 0.12. The bound leaves room for
        floating-point differences between machines, not for a regression.
        """
        surrogate = float(np.median([_campaign(seed) for seed in range(10)]))
        random = float(np.median([_random_search(seed, 20) for seed in range(10)]))
        assert surrogate <= 0.02
        assert surrogate < random / 5

    def test_a_held_out_function_keeps_its_worst_seed_better_than_random_search(self) -> None:
        """Rosenbrock in 3-D on [-2, 2]^3, ten rounds of four, seeds 0-9.

        Held out: nothing in the planner was tuned on it (the prior on the demo
        objective, the peers benchmark on Branin and Hartmann). Measured: simple
        regret median 1.57, worst seed 2.83; random search with the same budget
        20.3 and 66; scikit-optimize's GP 1.56 and 3.5, Optuna's TPE 6.9 and 15.7
        (benchmarks/planner_peers.py's methods). The worst seed is what a campaign
        owner lives with, so it is held as well as the median.
        """
        bounds = Bounds(lower=(-2.0,) * 3, upper=(2.0,) * 3)
        ours = [_best_of_campaign(_rosenbrock, bounds, seed, rounds=10) for seed in range(10)]
        rng = np.random.default_rng(0)
        uniform = [
            min(_rosenbrock(p) for p in rng.uniform(-2.0, 2.0, size=(40, 3)).tolist())
            for _ in range(10)
        ]
        assert float(np.median(ours)) < float(np.median(uniform)) / 5
        assert max(ours) < float(np.median(uniform)) / 2

    def test_hartmann_3d_keeps_every_seed_out_of_the_local_basin(self) -> None:
        """Ten rounds of four on Hartmann 3-D, seeds 0-9 (benchmarks/planner_peers.py's run).

        Issue 26's bar: a worst seed no worse than the best peer's, scikit-optimize's
        0.0048. Before the escape pick seed 4 ended in the local basin (regret 0.773);
        measured with it: worst 0.0002.
        """
        unit3 = Bounds.unit(3)
        regrets = [
            _best_of_campaign(_hartmann3, unit3, seed, rounds=10) - _H3_MINIMUM
            for seed in range(10)
        ]
        assert max(regrets) < 0.0048


class TestState:
    def test_state_is_plain_json(self) -> None:
        state = _trained(5).to_state()
        assert json.loads(json.dumps(state, allow_nan=False)) == state
        assert state["version"] == 2
        assert state["settings"] == {
            "length_scale": None,
            "noise": 1e-6,
            "kappa": 2.0,
            "pool_size": 1024,
            "acquisition": "ei",
            "max_points": 128,
        }

    def test_round_trip_keeps_proposals_bit_identical(self) -> None:
        model = _trained(12, length_scale=0.3, kappa=1.5, acquisition="lcb")
        model.assimilate([[0.2, 0.2]], [math.nan])
        restored = GaussianProcess.from_state(json.loads(json.dumps(model.to_state())))
        assert restored.to_state() == model.to_state()
        assert restored.propose(8, UNIT2, seed=9) == model.propose(8, UNIT2, seed=9)

    def test_a_whole_state_and_its_increments_restore_the_same_model(self) -> None:
        # What a campaign saves: a whole state at its first round, then what each round added.
        model, saved, states = GaussianProcess(), 0, []
        for index in range(6):
            batch = model.propose(4, UNIT2, seed=index)
            values = [objective(p) for p in batch]
            values[index % 4] = math.nan if index == 2 else values[index % 4]
            model.assimilate(batch, values)
            states.append(json.loads(json.dumps(model.to_state(since=saved))))
            saved = model.observations
        assert [len(s["values"]) for s in states] == [4, 4, 3, 4, 4, 4]
        assert "since" not in states[0]
        assert states[1]["since"] == 4
        restored = GaussianProcess.from_states(states)
        assert restored.to_state() == model.to_state()
        assert restored.skipped == 1
        assert restored.propose(8, UNIT2, seed=9) == model.propose(8, UNIT2, seed=9)
        # A record from before increments holds one whole state, the newest; later
        # rounds add increments to it.
        assert GaussianProcess.from_states([states[0], model.to_state()]).to_state() == (
            model.to_state()
        )

    def test_an_increment_that_does_not_continue_the_states_before_it_is_refused(
        self,
    ) -> None:
        model = _trained(6)
        whole, increment = _trained(4).to_state(), model.to_state(since=5)
        with pytest.raises(ValueError, match=r"state 1\.since: 5, but 4 observations"):
            GaussianProcess.from_states([whole, increment])
        with pytest.raises(ValueError, match=r"the first is missing"):
            GaussianProcess.from_states([increment])
        with pytest.raises(ValueError, match=r"state\.since: an increment"):
            GaussianProcess.from_state(increment)
        with pytest.raises(ValueError, match=r"since: 7 is not within 0\.\.6"):
            model.to_state(since=7)

    def test_a_restored_model_refits_what_the_running_one_kept(self) -> None:
        """Between two refits the running model reuses its fit; a restored one recomputes it."""
        model = _trained(40)
        model.propose(4, UNIT2, seed=0)  # fits on the first 40 observations
        more = np.random.default_rng(9).random((9, 2)).tolist()
        model.assimilate(more, [objective(p) for p in more])  # 49: still fitted on 40
        restored = GaussianProcess.from_state(json.loads(json.dumps(model.to_state())))
        assert restored.fitted_length_scales == model.fitted_length_scales
        assert restored.propose(8, UNIT2, seed=3) == model.propose(8, UNIT2, seed=3)

    def test_empty_state_round_trips(self) -> None:
        restored = GaussianProcess.from_state(GaussianProcess().to_state())
        assert restored.observations == 0

    def test_a_version_one_state_loads_its_observations_and_settings(self) -> None:
        state = {
            "kind": "gaussian_process",
            "version": 1,
            "settings": {"length_scale": None, "noise": 1e-6, "kappa": 2.5, "pool_size": 2048},
            "points": [[0.1, 0.2], [0.5, 0.5], [0.9, 0.3]],
            "values": [3.0, 1.0, 2.0],
            "skipped": 1,
        }
        model = GaussianProcess.from_state(state)
        assert (model.observations, model.skipped) == (3, 1)
        assert (model.kappa, model.pool_size, model.acquisition) == (2.5, 2048, "ei")
        assert model.to_state()["version"] == 2
        assert len(model.propose(4, UNIT2, seed=0)) == 4

    @pytest.mark.parametrize("version", [0, 3, None])
    def test_an_unknown_version_is_refused_by_name(self, version: int | None) -> None:
        state = _trained(3).to_state()
        state["version"] = version
        with pytest.raises(ValueError, match=rf"state.kind/version: .* got .* version {version}"):
            GaussianProcess.from_state(state)

    def test_wrong_kind_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"state.kind/version"):
            GaussianProcess.from_state({"kind": "forest", "version": 2})

    def test_missing_setting_is_named(self) -> None:
        state = _trained(3).to_state()
        del state["settings"]["acquisition"]
        with pytest.raises(ValueError, match=r"state\.settings: missing or invalid acquisition"):
            GaussianProcess.from_state(state)

    def test_invalid_setting_is_named(self) -> None:
        state = _trained(3).to_state()
        state["settings"]["max_points"] = 2
        with pytest.raises(ValueError, match=r"state\.settings: max_points"):
            GaussianProcess.from_state(state)

    def test_stored_nan_value_is_refused(self) -> None:
        state = _trained(3).to_state()
        state["values"][0] = math.nan
        with pytest.raises(ValueError, match=r"state\.values"):
            GaussianProcess.from_state(state)


def _rescore_everything(
    posterior: Posterior, pool: Any, count: int, score: Scorer, taken: set[Any]
) -> list[list[float]]:
    """The believer batch as it was first written: every pick rescores the whole pool."""
    cross = posterior.cross(pool)
    mean = cross.T @ posterior.alpha
    rows = posterior.whitened(cross)
    left = 1.0 - np.einsum("ij,ij->j", rows, rows)
    best, believed = posterior.best, np.empty((count, len(pool)))
    available, chosen, taken = np.ones(len(pool), dtype=bool), [], set(taken)
    escape = None
    unit = pool / posterior.lengths
    while len(chosen) < count and available.any():
        std = np.sqrt(posterior.variance * np.clip(left, 1e-12, None))
        scores = np.where(available, score(mean, std, best), np.inf)
        if escape is None and count > 1 and len(chosen) == count - 1:
            escape = escape_region(unit, chosen, int(np.argmin(scores)))
        if escape is not None and (escape & available).any():
            scores = np.where(escape & available, mean - 1.0 * std, np.inf)
        index = int(np.argmin(scores))
        available[index] = False
        key = tasks._acquisition.point_key(pool[index])
        if key in taken:
            continue
        taken.add(key)
        done = len(chosen)
        column = np.concatenate([rows[:, index], believed[:done, index]])
        pivot = math.sqrt(max(posterior.diagonal - float(column @ column), 1e-12))
        link = matern52(pool, pool[index : index + 1], posterior.lengths)[:, 0]
        row = (link - rows[:, index] @ rows - believed[:done, index] @ believed[:done]) / pivot
        believed[done] = row
        left = left - row * row
        best = min(best, float(mean[index]))
        chosen.append(index)
    return [pool[i].tolist() for i in chosen]

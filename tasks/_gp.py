"""Gaussian-process regression for the surrogate, in numpy only.

The kernel is a Matérn 5/2 with one length scale per dimension (ARD). The
signal variance is profiled out of the likelihood, so the hyperparameters are
the log length scales and the log noise ratio; they are the maximum of the
log marginal likelihood plus a weak log-normal prior (ML-II / MAP), found by a
small projected BFGS from a few fixed starts. Nothing here draws random
numbers: the same data give bit-identical hyperparameters and posteriors.

scipy's L-BFGS-B was tried and left out: importing ``scipy.optimize`` costs
about 0.4 s (on the resume path, before the fallback batch), and its own
OpenBLAS thread pool made each optimiser step ~6 ms on this loaded 2-core
machine, against ~0.1 ms for the whole likelihood in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

_SQRT5 = math.sqrt(5.0)
# Log length scales (inputs scaled to the data's span) and the log noise ratio
# are kept inside these boxes; the prior pulls length scales towards 0.5 and
# the noise towards 1e-3 without ruling out either end.
_LOG_LENGTH_BOX = (math.log(0.01), math.log(20.0))
_LOG_NOISE_MAX = math.log(1.0)
_PRIOR_LOG_LENGTH = (math.log(0.5), 1.0)
_PRIOR_LOG_NOISE = (math.log(1e-3), 3.0)
# Starting length scales for the optimiser (every dimension alike), tried in order;
# a third start (0.15, 0.5, 1.5) changed no result on the demo over 40 seeds.
_STARTS = (0.2, 1.0)
_ITERATIONS = 40


@dataclass(frozen=True)
class Hyperparameters:
    """Length scales (in the model's scaled input units) and the noise ratio."""

    lengths: Array
    noise: float


def matern52(a: Array, b: Array, lengths: Array) -> Array:
    """Return the Matérn 5/2 correlation between the rows of ``a`` and ``b``."""
    a = a / lengths
    b = b / lengths
    return matern52_unit(a, (a * a).sum(1), b, (b * b).sum(1))


def matern52_unit(a: Array, a_norms: Array, b: Array, b_norms: Array) -> Array:
    """Return ``matern52`` for rows already divided by the lengths, with their squared norms.

    A caller correlating one pool with many single points divides it once.
    """
    # In place where it can be: this is most of a proposal's arithmetic.
    squared = a_norms[:, None] + b_norms[None, :]
    squared -= 2.0 * (a @ b.T)
    np.maximum(squared, 0.0, out=squared)
    scaled_distance = np.sqrt(squared)
    scaled_distance *= _SQRT5
    kernel: Array = np.exp(-scaled_distance)
    squared *= 5.0 / 3.0
    squared += scaled_distance
    squared += 1.0
    kernel *= squared
    return kernel


def cholesky(matrix: Array) -> tuple[Array, float]:
    """Return the lower Cholesky factor and the extra jitter it needed.

    Exact duplicates make the kernel singular up to the noise; grow a jitter
    rather than fail, since a campaign may re-run a candidate.
    """
    jitter = 0.0
    eye = np.eye(len(matrix))
    for _ in range(12):
        try:
            factor = np.asarray(np.linalg.cholesky(matrix + jitter * eye), dtype=np.float64)
        except np.linalg.LinAlgError:
            jitter = max(jitter * 10.0, 1e-10)
        else:
            return factor, jitter
    raise np.linalg.LinAlgError("kernel matrix is not positive definite")


class Posterior:
    """A GP conditioned on scaled inputs ``x`` and standardised values ``y``."""

    def __init__(self, x: Array, y: Array, hyper: Hyperparameters, noise_floor: float) -> None:
        self.x = x
        self.lengths = hyper.lengths
        n = len(x)
        kernel = matern52(x, x, hyper.lengths)
        kernel[np.diag_indices(n)] += hyper.noise + noise_floor
        factor, jitter = cholesky(kernel)
        # The diagonal a believed (not yet observed) point would add to the kernel.
        self.diagonal = 1.0 + hyper.noise + noise_floor + jitter
        # An explicit inverse factor turns every later solve into one matrix product.
        self.inverse_factor: Array = np.asarray(np.linalg.solve(factor, np.eye(n)), np.float64)
        self.alpha: Array = self.inverse_factor.T @ (self.inverse_factor @ y)
        # The signal variance, profiled out of the likelihood; values that do not
        # vary say nothing about it, so they keep the prior's unit variance.
        profiled = float(y @ self.alpha) / n
        self.variance = profiled if profiled > 1e-12 else 1.0
        self.best = float(y.min())

    def cross(self, points: Array) -> Array:
        """Return the correlation between the training inputs and ``points``."""
        return matern52(self.x, points, self.lengths)

    def whitened(self, cross: Array) -> Array:
        """Return ``L^-1 k(X, points)``: the correlation left after the data, one row each."""
        rows: Array = self.inverse_factor @ cross
        return rows

    def mean_and_std(self, points: Array) -> tuple[Array, Array]:
        """Return the posterior mean and standard deviation (standardised units)."""
        cross = self.cross(points)
        rows = self.whitened(cross)
        mean: Array = cross.T @ self.alpha
        left = np.clip(1.0 - np.einsum("ij,ij->j", rows, rows), 1e-12, None)
        std: Array = np.sqrt(self.variance * left)
        return mean, std


def fit_hyperparameters(x: Array, y: Array, noise_floor: float) -> Hyperparameters:
    """Return the MAP hyperparameters for scaled inputs ``x`` and standardised ``y``.

    Fewer than three points, or values that do not vary, say nothing about the
    scales: the prior's centre is returned then.
    """
    n, dim = x.shape
    default = Hyperparameters(np.full(dim, math.exp(_PRIOR_LOG_LENGTH[0])), noise_floor)
    if n < 3 or float(np.ptp(y)) == 0.0:
        return default
    low = np.array([_LOG_LENGTH_BOX[0]] * dim + [math.log(max(noise_floor, 1e-10))])
    high = np.array([_LOG_LENGTH_BOX[1]] * dim + [_LOG_NOISE_MAX])
    squared_gaps = (x[:, None, :] - x[None, :, :]) ** 2

    def objective(theta: Array) -> tuple[float, Array]:
        return _negative_log_posterior(theta, squared_gaps, y, noise_floor)

    best: tuple[Array, float] | None = None
    for start in _STARTS:
        theta0 = np.array([math.log(start)] * dim + [_PRIOR_LOG_NOISE[0]])
        theta, value = minimise(objective, theta0, low, high, _ITERATIONS)
        if best is None or value < best[1]:
            best = (theta, value)
    assert best is not None  # _STARTS is not empty
    theta = best[0]
    return Hyperparameters(np.exp(theta[:dim]), math.exp(theta[dim]))


def _negative_log_posterior(
    theta: Array, squared_gaps: Array, y: Array, noise_floor: float
) -> tuple[float, Array]:
    """Return minus (concentrated log likelihood + log prior) and its gradient."""
    n, _, dim = squared_gaps.shape
    lengths = np.exp(theta[:dim])
    noise = math.exp(theta[dim])
    scaled = squared_gaps / (lengths * lengths)  # (n, n, dim)
    squared = scaled.sum(-1)
    distance = np.sqrt(squared)
    decay = np.exp(-_SQRT5 * distance)
    kernel = (1.0 + _SQRT5 * distance + (5.0 / 3.0) * squared) * decay
    kernel[np.diag_indices(n)] += noise + noise_floor
    try:
        factor = np.linalg.cholesky(kernel)
    except np.linalg.LinAlgError:
        return math.inf, np.zeros_like(theta)
    inverse_factor = np.linalg.solve(factor, np.eye(n))
    inverse = inverse_factor.T @ inverse_factor
    alpha = inverse @ y
    quadratic = max(float(y @ alpha), 1e-300)
    log_det = 2.0 * float(np.log(np.diagonal(factor)).sum())
    centred_lengths = (theta[:dim] - _PRIOR_LOG_LENGTH[0]) / _PRIOR_LOG_LENGTH[1]
    centred_noise = (theta[dim] - _PRIOR_LOG_NOISE[0]) / _PRIOR_LOG_NOISE[1]
    value = (
        0.5 * n * math.log(quadratic)
        + 0.5 * log_det
        + 0.5 * float(centred_lengths @ centred_lengths)
        + 0.5 * centred_noise**2
    )
    # d(log likelihood)/dK = W / 2 with W = n a a^T / (y^T a) - K^-1.
    weights = (n / quadratic) * np.outer(alpha, alpha) - inverse
    # dK/d(log length_i) = (5/3) e^{-sqrt5 r} (1 + sqrt5 r) (gap_i / length_i)^2.
    shared = weights * (5.0 / 3.0) * decay * (1.0 + _SQRT5 * distance)
    gradient = np.empty_like(theta)
    gradient[:dim] = -0.5 * np.einsum("ij,ijk->k", shared, scaled)
    gradient[:dim] += centred_lengths / _PRIOR_LOG_LENGTH[1]
    gradient[dim] = -0.5 * float(np.trace(weights)) * noise + centred_noise / _PRIOR_LOG_NOISE[1]
    return value, gradient


def minimise(
    function: Callable[[Array], tuple[float, Array]],
    start: Array,
    low: Array,
    high: Array,
    iterations: int,
) -> tuple[Array, float]:
    """Minimise ``function`` (value and gradient) inside a box by projected BFGS.

    A plain quasi-Newton method with an Armijo backtracking line search;
    coordinates held at a bound by the gradient are frozen for the step. Steps
    are capped at 2 in every coordinate (a factor e^2 on a length scale).
    Deterministic: no randomness, a fixed number of iterations at most.
    """
    x = np.clip(start, low, high)
    value, gradient = function(x)
    if not math.isfinite(value):
        return x, value
    inverse_hessian = np.eye(len(x))
    for _ in range(iterations):
        pinned = ((x <= low) & (gradient > 0)) | ((x >= high) & (gradient < 0))
        free_gradient = np.where(pinned, 0.0, gradient)
        if float(np.abs(free_gradient).max()) < 1e-6:
            break
        direction = -(inverse_hessian @ free_gradient)
        direction[pinned] = 0.0
        if float(direction @ free_gradient) >= 0.0:
            inverse_hessian = np.eye(len(x))
            direction = -free_gradient
        largest = float(np.abs(direction).max())
        if largest > 2.0:
            direction *= 2.0 / largest
        step = 1.0
        while True:
            candidate = np.clip(x + step * direction, low, high)
            new_value, new_gradient = function(candidate)
            if new_value <= value + 1e-4 * float(gradient @ (candidate - x)):
                break
            step *= 0.5
            if step < 1e-6:
                return x, value
        moved = candidate - x
        change = new_gradient - gradient
        curvature = float(moved @ change)
        if curvature > 1e-10:
            rho = 1.0 / curvature
            eye = np.eye(len(x))
            inverse_hessian = (eye - rho * np.outer(moved, change)) @ inverse_hessian @ (
                eye - rho * np.outer(change, moved)
            ) + rho * np.outer(moved, moved)
        converged = value - new_value < 1e-9 * (1.0 + abs(value))
        x, value, gradient = candidate, new_value, new_gradient
        if converged:
            break
    return x, value

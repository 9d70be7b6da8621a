"""Work on the allocation: executor, simulation batches, verifiers, surrogate, planners."""

__all__: list[str] = []

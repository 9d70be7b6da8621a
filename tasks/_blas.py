"""Run the surrogate's linear algebra on one BLAS thread.

The surrogate's matrices are small (at most a few hundred rows), where a
second BLAS thread gains little at rest and loses badly on a shared login
node: at load 10 on this 2-core machine a proposal took 130-470 ms with
OpenBLAS's default two threads and 9-40 ms with one. One thread also makes the
results independent of the machine's thread count. ``threadpoolctl`` is the
maintained way to set this at run time (numpy reads ``OPENBLAS_NUM_THREADS``
only when it is first imported); it is imported on first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_controller: Any = None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit every loaded BLAS library to one thread inside the block.

    The limit is process-wide while the block runs; other threads' BLAS calls
    in that window run on one thread too.
    """
    global _controller  # one controller per process, built on first use
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    with _controller.limit(limits=1, user_api="blas"):
        yield

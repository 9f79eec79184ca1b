"""A small thread pool for memory-bound array loops that NumPy runs on one core (copies, element-wise updates).

NumPy releases the GIL inside such loops, so splitting a loop over disjoint slices runs it on all cores the
process may use. The pool has as many threads as BLAS is given (``SPMDCNN_NUM_THREADS``, else
``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, else the CPUs this process may run on): under ``mpiexec`` with
one thread per rank it stays out of the other ranks' way.
"""

import threading
from concurrent.futures import ThreadPoolExecutor, wait

_pool = None
_pool_lock = threading.Lock()
_inside = threading.local()      # set in the pool's threads: a nested parallel_for runs inline, never waits


def num_threads():
    """The threads of this process: those BLAS is given (:func:`spmdcnn.threads_per_rank`)."""
    from .. import threads_per_rank
    return threads_per_rank(1)


def _executor():
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=num_threads(), thread_name_prefix="spmdcnn")
        return _pool


def parallel_for(body, count, min_items=1):
    """Run ``body(start, stop)`` over ``range(count)`` split into one contiguous part per thread.

    Returns only when every part has finished, also when one of them raised (the first error is re-raised):
    no part may still be writing into memory the caller reuses.
    """
    threads = min(num_threads(), count // max(min_items, 1))
    if threads <= 1 or getattr(_inside, "active", False):
        body(0, count)
        return
    bounds = [count * i // threads for i in range(threads + 1)]

    def part(start, stop):
        _inside.active = True
        try:
            body(start, stop)
        finally:
            _inside.active = False
    futures = [_executor().submit(part, bounds[i], bounds[i + 1]) for i in range(threads)]
    wait(futures)
    for future in futures:
        future.result()


def over_samples(xp, body, count):
    """``body(start, stop)`` over ``count`` samples: split between threads on the host (NumPy), one call on a
    GPU, whose kernels are parallel already."""
    if xp.__name__ == "numpy":
        parallel_for(body, count)
    else:
        body(0, count)

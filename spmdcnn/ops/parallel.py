"""A small thread pool for memory-bound array loops that NumPy runs on one core (copies, element-wise updates).

NumPy releases the GIL inside such loops, so splitting a loop over disjoint slices runs it on all cores the
process may use. The pool has as many threads as BLAS is given (``SPMDCNN_NUM_THREADS``, else
``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, else the CPUs this process may run on): under ``mpiexec`` with
one thread per rank it stays out of the other ranks' way.

A loop is split only where each thread gets at least :data:`GRAIN` elements: waking a thread, and the Python
each part runs between NumPy's calls (which holds the GIL), cost more than they save below it. Measured on the
2-core VM of benchmarks/README.md, one process, medians of 30 steps: small_resnet at batch 32 took 14.5-18.9 ms
with every loop split and 11.1 ms with none; with batch norm's calls on blocks of samples (ops/batchnorm.py)
and a grain of 256 Ki, 512 Ki and 1 Mi elements it took 10.2-10.7, 9.7-12.1 and 9.3-9.9 ms, while
alexnet_reduced at batch 32 took 66-69, 72-83 and 79-82 ms (63-65 ms with every loop split, 77-82 with none).
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


GRAIN = 1 << 18         # elements a thread's part must touch for a split to pay


def parallel_for(body, count, elements):
    """Run ``body(start, stop)`` over ``range(count)`` split into one contiguous part per thread, as many threads
    as give each part at least :data:`GRAIN` of the loop's ``elements`` (all of them run inline below that).

    Returns only when every part has finished, also when one of them raised (the first error is re-raised):
    no part may still be writing into memory the caller reuses.
    """
    threads = min(num_threads(), count, elements // GRAIN)
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


CHUNK = 1 << 16         # elements of each operand a chunked pass takes at a time: 256 KiB of float32, in the core's L2


def over_chunks(body, size, chunk=None):
    """``body(part)`` for consecutive slices ``part`` of ``range(size)``, ``chunk`` elements each (default
    :data:`CHUNK`), split between
    threads as :func:`parallel_for` splits loops: element-wise passes over flattened (contiguous) arrays whose
    several NumPy calls then meet each chunk in cache, so that a kernel of a few calls reads and writes memory once.
    """
    chunk = chunk or CHUNK

    def run(first, last):
        for start in range(first * chunk, min(size, last * chunk), chunk):
            body(slice(start, min(size, start + chunk)))
    parallel_for(run, -(-size // chunk), size)


def over_samples(xp, body, count, elements):
    """``body(start, stop)`` over ``count`` samples that touch ``elements`` array elements in all: split between
    threads on the host (NumPy) where that pays (:func:`parallel_for`), one call on a GPU, whose kernels are
    parallel already."""
    if xp.__name__ == "numpy":
        parallel_for(body, count, elements)
    else:
        body(0, count)

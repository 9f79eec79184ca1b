"""A blocking MPI_Allreduce against MPI_Iallreduce + MPI_Wait of the same array, from 8 B to 64 MiB: what the
communication thread runs against what testing between layers runs (``SPMDCNN_SYNC_PROGRESS=test``), in the MPI
library mpi4py loads. Run under mpiexec:

    mpiexec -n 2 python benchmarks/collectives.py --rounds 5

Each size alternates the two calls, ``--rounds`` times, each a median of ``--repeats`` calls after a barrier; rank
0 prints the best round of each (float32 sums, in place).
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)


def timed(comm, array, blocking, repeats):
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        if blocking:
            comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        else:
            comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM).Wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"{MPI.Get_library_version().splitlines()[0]}; {comm.size} ranks; best of {args.rounds} rounds")
        print(f"{'bytes':>10}  {'Allreduce ms':>12}  {'Iallreduce+Wait ms':>18}  ratio")
    for nbytes in SIZES:
        array = np.ones(max(nbytes // 4, 2), dtype=np.float32)
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.rounds):
            for blocking in (True, False):
                best[blocking] = min(best[blocking], timed(comm, array, blocking, args.repeats))
        if comm.rank == 0:
            print(f"{nbytes:>10}  {best[True] * 1e3:12.3f}  {best[False] * 1e3:18.3f}  {best[False] / best[True]:5.2f}")


if __name__ == "__main__":
    main()

"""How bytes move between ranks (docs/architecture.md#communication): one interface, three transports.

- ``host``: MPI on host buffers. NumPy arrays go as they are; CuPy arrays are staged through page-locked host
  buffers (copied down after the stream is synchronized, copied up after the receive). Works everywhere.
- ``cuda-mpi``: MPI on device buffers (mpi4py reads CuPy arrays through ``__cuda_array_interface__``), for an MPI
  built CUDA-aware. Detected, never assumed (:func:`cuda_aware_mpi`): handing a device buffer to an MPI that is
  not CUDA-aware crashes the process. The stream is synchronized before MPI touches a device buffer.
- ``nccl``: NCCL through ``cupy.cuda.nccl``: one NCCL communicator per MPI communicator (its unique id broadcast
  over MPI), ``allReduce`` for collectives and grouped ``send``/``recv`` for redistributions. NCCL refuses a
  communicator in which two ranks share a GPU, so it is only tried when every rank has a GPU of its own.

``auto`` picks the fastest that works on every rank: nccl, then cuda-mpi, then host (NumPy: host). Every rank
makes the same choice (:func:`choose`), and rank 0 logs it.

A transport's point-to-point interface is one call per exchange: :meth:`Transport.exchange` takes the receives
and the sends of one layer's redistribution and returns when all have completed. Receives and sends between the
same pair of ranks are matched in posting order (MPI: per tag; NCCL: per pair), so every rank posts them in the
order of the plan's transfer list.
"""

import ctypes
import functools
import os

import numpy as np

from .errors import CollectiveError

TRANSPORTS = ("auto", "host", "cuda-mpi", "nccl")


def mpi():
    """mpi4py's MPI module, imported (and MPI initialised) on first use."""
    from mpi4py import MPI
    return MPI


def _is_device(array):
    return type(array).__module__.startswith("cupy")


def _bytes(buffer):
    """``buffer`` as MPI can take it: a type MPI has no name for (bfloat16) travels as raw 16-bit words."""
    if buffer.dtype.name == "bfloat16":
        return buffer.view(np.uint16)
    return buffer


class Pending:
    """An allreduce in flight (:meth:`HostTransport.iallreduce`): :meth:`test` says whether it has completed
    (and, for MPI's own non-blocking collectives, drives their progress), :meth:`wait` blocks until the sum is in
    the array. ``request``: an MPI request; else ``done()`` tells and ``block()`` waits."""

    def __init__(self, request=None, done=None, block=None, finished_at=None):
        self.request, self.done, self.block = request, done, block
        self.finished_at = finished_at      # when the sum was done, where the one doing it tells (the thread)
        self.after = []
        self.complete = False

    def then(self, action):
        """Run ``action()`` once complete (a staged copy back to the device)."""
        self.after.append(action)

    def test(self):
        if not self.complete:
            if self.request is not None:
                if self.request.Test():
                    self._complete()
            elif self.done():
                self.block()                # raises what the communication thread met
                self._complete()
        return self.complete

    def wait(self):
        if not self.complete:
            if self.request is not None:
                self.request.Wait()
            else:
                self.block()
            self._complete()

    def _complete(self):
        self.complete = True
        for action in self.after:
            action()


@functools.cache
def _thread_multiple():
    """Whether MPI was initialised with MPI_THREAD_MULTIPLE (fixed for the process)."""
    return mpi().Query_thread() >= mpi().THREAD_MULTIPLE


def progress():
    """How overlapped allreduces progress on MPI: ``thread``, blocking collectives on a communication thread of
    their own, when MPI allows calls from several threads at once (MPI_THREAD_MULTIPLE); else, or with
    ``SPMDCNN_SYNC_PROGRESS=test``, ``test``: MPI's non-blocking collectives driven by the executor between layers
    (MPICH and Open MPI progress them only inside MPI calls)."""
    forced = os.environ.get("SPMDCNN_SYNC_PROGRESS")
    if forced == "test" or not _thread_multiple():
        return "test"           # two threads in MPI at once without MPI_THREAD_MULTIPLE is undefined: never
    return "thread"


class _Lane:
    """The communication thread: blocking collectives one after the other, in the order submitted (the same on
    every rank), on communicators no other thread uses (:meth:`~spmdcnn.comm.groups.ReplicaGroups.starter`).
    mpi4py releases the GIL inside MPI calls, so backward computes meanwhile."""

    def __init__(self):
        import queue
        import threading
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="spmdcnn-sync")
        self.thread.start()

    def _run(self):
        import time
        while True:
            item = self.queue.get()
            if item is None:
                return
            work, done, failure, finished = item
            try:
                work()
            except BaseException as error:      # noqa: BLE001 -- handed to the waiting rank
                failure.append(error)
            finished.append(time.perf_counter())
            done.set()

    def submit(self, work):
        import threading
        done, failure, finished = threading.Event(), [], []

        def block():
            done.wait()
            if failure:
                raise failure[0]
        self.queue.put((work, done, failure, finished))
        return Pending(done=done.is_set, block=block, finished_at=lambda: finished[0] if finished else None)

    def stop(self, timeout=5.0):
        """Let the work submitted finish, then end the thread (waiting at most ``timeout`` seconds)."""
        self.queue.put(None)
        self.thread.join(timeout)


def _synchronize():
    """Wait for the work queued on the current stream (which wrote what MPI is about to read, or may still read
    memory MPI is about to write) before MPI touches device memory."""
    import cupy
    cupy.cuda.get_current_stream().synchronize()


class HostTransport:
    """MPI on host memory; device arrays are staged through the host."""

    name = "host"

    def send_buffer(self, array):
        """A contiguous host buffer holding ``array`` (the array itself when it is one; a device array's copy in
        page-locked memory from CuPy's pool, which the copy engine fills directly)."""
        if _is_device(array):
            import cupy
            import cupyx
            host = cupyx.empty_pinned(array.shape, dtype=array.dtype)
            cupy.ascontiguousarray(array).get(out=host)          # waits for the stream
            return host
        return np.ascontiguousarray(array)

    def recv_buffer(self, target):
        """Where to receive into for ``target``: the target itself when MPI can write into it (a contiguous host
        array), else a host buffer (page-locked for a device target)."""
        if not _is_device(target):
            return target if target.flags.c_contiguous else np.empty(target.shape, dtype=target.dtype)
        import cupyx
        return cupyx.empty_pinned(target.shape, dtype=target.dtype)

    def exchange(self, comm, recvs, sends):
        """Post every receive ``(buffer, source, tag)``, then every send ``(buffer, dest, tag)``; wait for all."""
        requests = [comm.Irecv(_bytes(buffer), source=source, tag=tag) for buffer, source, tag in recvs]
        requests += [comm.Isend(_bytes(buffer), dest=dest, tag=tag) for buffer, dest, tag in sends]
        if requests:
            mpi().Request.Waitall(requests)

    def allreduce(self, array, comm):
        """Sum the contiguous ``array`` over ``comm`` in place."""
        MPI = mpi()
        if not _is_device(array):
            comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
            return array
        host = array.get()
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        array.set(host)
        return array

    def iallreduce(self, array, comm):
        """Start summing the contiguous ``array`` over ``comm`` in place; returns its :class:`Pending`. The array
        must not be touched until the Pending has completed. A device array is staged through the host."""
        MPI = mpi()
        device = _is_device(array)
        host = self.send_buffer(array) if device else array         # waits for the stream that wrote it
        if progress() == "thread":
            pending = self._lane().submit(lambda: comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM))
        else:
            pending = Pending(comm.Iallreduce(MPI.IN_PLACE, host, op=MPI.SUM))
        if device:
            pending.then(lambda: array.set(host))
        return pending

    def _lane(self):
        if getattr(self, "_thread", None) is None:
            self._thread = _Lane()
        return self._thread

    def attach(self, comm):
        """Called (collectively over ``comm``) for every communicator the transport will be used on."""

    def close(self):
        if getattr(self, "_thread", None) is not None:
            self._thread.stop()
            self._thread = None


class CudaMpiTransport(HostTransport):
    """MPI on device buffers: an MPI built CUDA-aware reads and writes CuPy arrays itself."""

    name = "cuda-mpi"

    def send_buffer(self, array):
        if _is_device(array):
            import cupy
            return cupy.ascontiguousarray(array)
        return np.ascontiguousarray(array)

    def recv_buffer(self, target):
        if target.flags.c_contiguous:
            return target
        if _is_device(target):
            import cupy
            return cupy.empty(target.shape, dtype=target.dtype)
        return np.empty(target.shape, dtype=target.dtype)

    def exchange(self, comm, recvs, sends):
        # the kernels that fill the send buffers, and the ones still reading memory a receive buffer reuses,
        # must be done before MPI touches device memory outside the stream's order
        if any(_is_device(buffer) for buffer, _, _ in recvs + sends):
            _synchronize()
        super().exchange(comm, recvs, sends)

    def allreduce(self, array, comm):
        MPI = mpi()
        if _is_device(array):
            _synchronize()
        comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return array

    def iallreduce(self, array, comm):
        MPI = mpi()
        if _is_device(array):
            _synchronize()
        return Pending(comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM))


class NcclTransport(CudaMpiTransport):
    """NCCL on the current stream; every rank on a GPU of its own."""

    name = "nccl"

    def __init__(self):
        from cupy.cuda import nccl
        self.nccl = nccl
        self.comms = {}          # id(mpi communicator) -> (mpi communicator, NCCL communicator)
        self._stream = None      # the stream overlapped allreduces run on (iallreduce)

    def attach(self, comm):
        if comm is None or comm.Get_size() < 2 or id(comm) in self.comms:
            return
        nccl = self.nccl
        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = comm.bcast(uid, root=0)
        self.comms[id(comm)] = (comm, nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank()))

    def _comm(self, comm):
        if id(comm) not in self.comms:
            self.attach(comm)     # collective over comm: every member reaches its first use at the same point
        return self.comms[id(comm)][1]

    def _type(self, dtype):
        nccl, dtype = self.nccl, np.dtype(dtype)
        if dtype.name == "bfloat16":
            return nccl.NCCL_BFLOAT16
        types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                 np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int64): nccl.NCCL_INT64,
                 np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.uint8): nccl.NCCL_UINT8}
        if dtype not in types:
            raise TypeError(f"nccl transport: no NCCL type for {dtype}")
        return types[dtype]

    def _device(self, array):
        import cupy
        return cupy.ascontiguousarray(cupy.asarray(array))

    def exchange(self, comm, recvs, sends):
        import cupy
        nc = self._comm(comm)
        stream = cupy.cuda.get_current_stream().ptr
        # every buffer on the device and every type known before the group starts: an error inside a group
        # would launch half of it
        incoming = [(buffer, buffer if _is_device(buffer) else cupy.empty(buffer.shape, buffer.dtype), source)
                    for buffer, source, _ in recvs]
        outgoing = [(self._device(buffer), dest) for buffer, dest, _ in sends]
        types = [self._type(device.dtype) for _, device, _ in incoming] + \
            [self._type(device.dtype) for device, _ in outgoing]
        self.nccl.groupStart()
        try:
            for (_, device, source), kind in zip(incoming, types):
                nc.recv(device.data.ptr, device.size, kind, source, stream)
            for (device, dest), kind in zip(outgoing, types[len(incoming):]):
                nc.send(device.data.ptr, device.size, kind, dest, stream)
        finally:
            self.nccl.groupEnd()
        for buffer, device, _ in incoming:
            if buffer is not device:
                device.get(out=buffer)
        cupy.cuda.get_current_stream().synchronize()     # outgoing buffers may be freed after this

    def allreduce(self, array, comm):
        import cupy
        nc = self._comm(comm)
        device = array if _is_device(array) else cupy.asarray(array)
        stream = cupy.cuda.get_current_stream()
        nc.allReduce(device.data.ptr, device.data.ptr, device.size, self._type(device.dtype), self.nccl.NCCL_SUM,
                     stream.ptr)
        if device is not array:
            device.get(out=array)
        stream.synchronize()        # the sync counters time the reduction itself, not only its launch
        return array

    def iallreduce(self, array, comm):
        """The allreduce on a communication stream of its own, after the work the current stream has queued
        (which wrote the gradients); it runs while the current stream goes on with backward."""
        import cupy
        if not _is_device(array):
            return super().iallreduce(array, comm)
        nc = self._comm(comm)
        if self._stream is None:
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._stream.wait_event(cupy.cuda.get_current_stream().record())
        nc.allReduce(array.data.ptr, array.data.ptr, array.size, self._type(array.dtype), self.nccl.NCCL_SUM,
                     self._stream.ptr)
        done = self._stream.record()
        return Pending(done=lambda: done.done, block=done.synchronize)

    def close(self):
        super().close()
        for _, nc in self.comms.values():
            nc.destroy()
        self.comms.clear()


def cuda_aware_mpi():
    """Whether the MPI library in this process is CUDA-aware, and how that was found: ``(bool, reason)``.

    ``SPMDCNN_CUDA_AWARE_MPI=1/0`` decides (for MPIs with no query, such as Cray MPICH with
    MPICH_GPU_SUPPORT_ENABLED=1). Otherwise the library is asked: Open MPI's ``MPIX_Query_cuda_support`` and
    MPICH's ``MPIX_GPU_query_support``, both looked up in the loaded MPI library. An MPI that cannot answer is
    taken as not CUDA-aware.
    """
    forced = os.environ.get("SPMDCNN_CUDA_AWARE_MPI")
    if forced in ("0", "1"):
        return forced == "1", f"SPMDCNN_CUDA_AWARE_MPI={forced}"
    mpi()
    library = _mpi_library()
    if library is None:
        return False, "the MPI library was not found among this process's loaded libraries"
    if hasattr(library, "MPIX_Query_cuda_support"):
        library.MPIX_Query_cuda_support.restype, library.MPIX_Query_cuda_support.argtypes = ctypes.c_int, []
        answer = bool(library.MPIX_Query_cuda_support())
        return answer, f"MPIX_Query_cuda_support() = {int(answer)}"
    if hasattr(library, "MPIX_GPU_query_support"):
        library.MPIX_GPU_query_support.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        supported = ctypes.c_int(0)
        cuda = 0                                   # MPIX_GPU_SUPPORT_CUDA (ZE is 1, HIP 2)
        if library.MPIX_GPU_query_support(cuda, ctypes.byref(supported)) == 0:
            return bool(supported.value), f"MPIX_GPU_query_support(CUDA) = {supported.value}"
    return False, "the MPI library has no CUDA-awareness query"


def _mpi_library():
    """The MPI shared library mpi4py loaded, opened with ctypes (None if it is not found)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths, key=lambda p: ("libmpi.so" not in p, p)):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _gpu_identity(xp):
    """``(NCCL importable, (node, GPU uuid))`` for this rank; no communication."""
    try:
        from cupy.cuda import nccl
        available = bool(getattr(nccl, "available", True))
    except ImportError:
        available = False
    device = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    return available, (os.uname().nodename, bytes(device.get("uuid", b"")) or device["pciBusID"])


def _nccl_possible(world, xp):
    """``(bool, reason)``, the same on every rank: NCCL is importable everywhere and no two ranks share a GPU."""
    everyone = world.allgather(world.agree(lambda: _gpu_identity(xp)))
    if not all(available for available, _ in everyone):
        return False, "CuPy has no NCCL"
    gpus = [gpu for _, gpu in everyone]
    if len(set(gpus)) < len(gpus):
        return False, "ranks share a GPU, which NCCL refuses"
    return True, "every rank has a GPU of its own"


def check(name, xp):
    """Refuse a ``transport`` that cannot work with array module ``xp`` whatever the ranks (no communication:
    jobs call it while loading, before anything collective)."""
    if name not in TRANSPORTS:
        raise ValueError(f"transport: unknown transport {name!r}; expected one of {', '.join(TRANSPORTS)}")
    if name in ("cuda-mpi", "nccl") and xp is np:
        raise ValueError(f"transport: {name!r} moves device arrays; it needs backend: cupy")


def choose(world, xp, name="auto", log=None):
    """The transport for a job's ``transport`` key on array module ``xp``: the same on every rank.

    ``auto`` tries nccl, then cuda-mpi, then host; an explicit name that cannot work here is an error (on every
    rank). Logs the choice and why through ``log`` (rank 0). Every failure is the same on every rank: a
    :class:`~spmdcnn.comm.errors.CollectiveError`, reported once.
    """
    try:
        check(name, xp)
    except ValueError as error:
        raise CollectiveError(str(error)) from None
    if xp is np or world.size == 1:
        return HostTransport()
    verdicts = {}
    if name in ("auto", "nccl"):
        verdicts["nccl"] = _nccl_possible(world, xp)
    if name in ("auto", "cuda-mpi"):
        ok, why = cuda_aware_mpi()
        verdicts["cuda-mpi"] = _everywhere(world, ok, why)
    verdicts["host"] = (True, "always works")
    order = ("nccl", "cuda-mpi", "host") if name == "auto" else (name,)
    for candidate in order:
        ok, why = verdicts[candidate]
        if ok:
            transport = world.agree(lambda: _make(candidate))
            if log:
                tried = "; ".join(f"{n}: {verdicts[n][1]}" for n in order if n != candidate and n in verdicts)
                log(f"transport {candidate} ({why})" + (f"; not {tried}" if tried and name == "auto" else ""))
            return transport
        if name != "auto":
            raise CollectiveError(f"transport: {name!r} cannot work here: {why}")
    raise AssertionError("host always works")


def _everywhere(world, ok, why):
    """``(ok on every rank, the reason of the lowest rank where it is not)``."""
    answers = world.allgather((bool(ok), why))
    for rank, (fine, reason) in enumerate(answers):
        if not fine:
            return False, reason + ("" if world.size == 1 else f" (rank {rank})")
    return True, answers[0][1]


def _make(name):
    return {"host": HostTransport, "cuda-mpi": CudaMpiTransport, "nccl": NcclTransport}[name]()

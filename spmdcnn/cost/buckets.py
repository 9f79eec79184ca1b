"""Gradient buckets: which parameter gradients are summed by one allreduce, the rule the runtime runs and the cost
model charges (docs/architecture.md#gradient-buckets).

Within each replica group (the ranks holding the same parameter shards), the shards are taken in reverse layer
order, as backward finishes them, and packed into buckets of at most ``bucket_mb`` MiB (a tensor is never split;
one larger than the cap is a bucket alone). As in PyTorch's DistributedDataParallel, the first bucket is capped
lower, at 1 MiB, so that communication starts early in backward. A bucket is ready when the backward of the
earliest layer it holds has run; with ``overlap`` its allreduce starts then and runs while backward goes on.
"""

from dataclasses import dataclass, replace

from .machine import SYNC_MODES

MIB = 1 << 20
FIRST_BUCKET_BYTES = MIB        # DDP's dist._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class SyncOptions:
    """The job's ``sync`` section (bucket cap in MiB, whether bucket allreduces overlap backward) and the
    machine's ``sync`` (``mode``: ``allreduce``, or ``parameter-server``: one bucket per layer and replica group,
    summed through the group's server right after the layer's backward, whatever ``bucket_mb`` and
    ``overlap`` say)."""

    bucket_mb: float = 25.0
    overlap: bool = True
    mode: str = "allreduce"

    def __post_init__(self):
        if isinstance(self.bucket_mb, bool) or not isinstance(self.bucket_mb, (int, float)) or not self.bucket_mb > 0:
            raise ValueError(f"sync.bucket_mb must be a positive number of MiB, got {self.bucket_mb!r}")
        if self.mode not in SYNC_MODES:
            raise ValueError(f"the machine's sync must be 'allreduce' or 'parameter-server', got {self.mode!r}")

    @classmethod
    def of(cls, spec, mode=None):
        """From a job's ``sync`` mapping (None: the defaults) and the machine's ``mode`` (None: allreduce, or the
        instance's own); an instance passes through, with ``mode`` when given."""
        if isinstance(spec, cls):
            return spec if mode is None else replace(spec, mode=mode)
        spec = spec or {}
        return cls(float(spec.get("bucket_mb", cls.bucket_mb)), bool(spec.get("overlap", cls.overlap)),
                   mode or cls.mode)

    @property
    def served(self):
        """Whether gradients go through parameter servers (``mode: parameter-server``)."""
        return self.mode == "parameter-server"

    @property
    def overlapping(self):
        """Whether a bucket's sum starts when backward has made it, not after backward: with ``overlap``, and
        always for a server's pull (which leaves as soon as the push is in)."""
        return self.overlap or self.served

    @property
    def cap_bytes(self):
        return int(self.bucket_mb * MIB)

    @property
    def first_bytes(self):
        return min(FIRST_BUCKET_BYTES, self.cap_bytes)


def pack(sizes, options):
    """Split ``sizes`` (bytes of each tensor, in the order backward finishes them) into buckets: a list of
    ``(first, stop)`` index ranges, in that order."""
    buckets, start, filled = [], 0, 0
    for index, size in enumerate(sizes):
        cap = options.first_bytes if not buckets else options.cap_bytes
        if index > start and filled + size > cap:
            buckets.append((start, index))
            start, filled = index, 0
        filled += size
    if start < len(sizes):
        buckets.append((start, len(sizes)))
    return buckets


def assign(tensors, order, options):
    """One rank's buckets: ``tensors`` is ``{group: [(layer, nbytes), ...]}``, each group's summed tensors in
    layer order (as the flat store holds them), ``order`` the layers' positions in the model. Returns
    ``(group, first, stop, ready)`` per bucket (``[first, stop)`` indexes the group's list; ``ready``: the layer
    whose backward completes it), in the order backward makes them ready: by that layer, last first, then group,
    then place in the group (its later tensors first). Under ``options.served`` each layer's tensors of a group
    are a bucket of their own."""
    found = []
    for group, items in tensors.items():
        if options.served:          # one bucket per layer: its server's sum right after its backward
            starts = [i for i in range(len(items)) if i == 0 or items[i][0] != items[i - 1][0]]
            found += [(group, lo, hi, items[lo][0]) for lo, hi in zip(starts, starts[1:] + [len(items)])]
            continue
        count = len(items)
        for first, stop in pack([nbytes for _, nbytes in reversed(items)], options):
            lo, hi = count - stop, count - first
            found.append((group, lo, hi, items[lo][0]))
    found.sort(key=lambda bucket: (-order[bucket[3]], bucket[0], -bucket[1]))
    return found

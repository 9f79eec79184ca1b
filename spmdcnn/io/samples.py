"""What samples are called by their spatial axes, in messages and ``data info``: sequences (C, W), images (C, H, W)
and volumes (C, D, H, W). The axes' names are those of plan files and of ``data.augment.flip``."""

AXES = ("d", "h", "w")          # the spatial axes' names: a sample with fewer has the last ones
KINDS = {1: "sequence", 2: "image", 3: "volume"}


def axis_names(rank):
    """The names of ``rank`` spatial axes: ``w``; ``h, w``; ``d, h, w``."""
    return AXES[len(AXES) - rank:]


def axes_text(rank, between=", "):
    """``D, H, W`` (``between``: what separates them, `` x `` between extents)."""
    return between.join(name.upper() for name in axis_names(rank))


def kind(rank, plural=True):
    """``volumes`` (``plural``) or ``a volume``; ``samples`` or ``a sample`` of a rank without a name."""
    name = KINDS.get(rank, "sample")
    return f"{name}s" if plural else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def layout(rank):
    """``(C, D, H, W)``: a sample's axes."""
    return f"(C, {axes_text(rank)})"


def described(rank, plural=True):
    """``volumes (C, D, H, W)``, ``an image (C, H, W)``."""
    return f"{kind(rank, plural)} {layout(rank)}"

"""Sizes in bytes as people write and read them: ``80GB``, ``1.5 GiB`` (job and command-line memory limits, the
memory model's reports)."""

import math

_UNITS = ("B", "KiB", "MiB", "GiB")


def _unit(count):
    """The index of the unit ``count`` bytes read best in."""
    index = 0
    while index < len(_UNITS) - 1 and count >= 1024 ** (index + 1):
        index += 1
    return index


def format_bytes(count, digits=1, unit=None):
    """``count`` bytes as people read them: ``512 B``, ``1.5 KiB``, ``3.8 GiB`` (``digits`` after the point;
    ``unit`` an index into B, KiB, MiB, GiB, else the one that suits ``count``)."""
    index = _unit(count) if unit is None else unit
    if index == 0:
        return f"{count:.0f} B"
    return f"{count / 1024 ** index:.{digits}f} {_UNITS[index]}"


def format_against(used, limit, most=4):
    """``(used, limit)`` as text in one unit, with the fewest digits (at most ``most``) that tell them apart, so
    that a limit's effect shows: ``1.85 GiB`` against ``1.87 GiB``, not ``1.9`` against ``1.9``."""
    index = _unit(max(used, limit))
    for digits in range(1, most + 1):
        pair = format_bytes(used, digits, index), format_bytes(limit, digits, index)
        if pair[0] != pair[1] or used == limit:
            break
    return pair


def parse_size(text):
    """``"12GiB"``, ``"1.5e9"``, ``"800 MB"``: bytes (GiB, MiB, KiB are powers of 1024; GB, MB, kB of 1000)."""
    units = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2 ** 10, "mib": 2 ** 20,
             "gib": 2 ** 30, "tib": 2 ** 40}
    cleaned = str(text).strip().lower().replace(" ", "")
    number = cleaned.rstrip("kmgtib")
    unit = cleaned[len(number):]
    try:
        value = float(number) * units[unit]
    except (KeyError, ValueError):
        raise ValueError(f"not a size: {text!r} (say 16GiB, 800MB or 1.5e9)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value

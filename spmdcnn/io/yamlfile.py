"""YAML reading with errors that name the file, and the checks every spmdcnn file format shares."""

import difflib
import os

import yaml

# libyaml's parser where PyYAML was built with it (the wheels are): the same documents, several times faster
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class FormatError(ValueError):
    """A user's file does not follow its format; the message names the file and the place."""


def load_yaml_text(text, source):
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(error, "problem", None) or str(error)
        raise FormatError(f"{source}: not valid YAML{where}: {problem}") from None


def read_yaml(path, what="file"):
    """``(data, text)`` of a YAML file; a clear error when it is missing, unreadable or not YAML."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise FormatError(f"{path}: {what} not found{did_you_mean(path)}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise FormatError(f"{path}: cannot read {what}: {error}") from None
    return load_yaml_text(text, path), text


def did_you_mean(path):
    """`` (did you mean X?)`` naming the file of ``path``'s folder that it most likely meant (its name with another
    extension, ``.yml`` for ``.yaml``, or a close spelling), or ``""``."""
    folder, name = os.path.split(str(path))
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return ""
    stem = os.path.splitext(name)[0]
    found = [n for n in names if os.path.splitext(n)[0] == stem and n != name] or \
        difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f" (did you mean {os.path.join(folder, found[0])}?)" if found else ""


def shipped(path, folder):
    """``path``, or where a bare name of a file spmdcnn ships lies: ``folder`` (relative to the checkout a command
    runs in) holds ``path``, with ``.yaml`` added when it has no extension, and ``path`` itself does not exist."""
    path = str(path)
    if os.path.exists(path) or os.sep in path:
        return path
    found = os.path.join(folder, path if path.endswith((".yaml", ".yml")) else path + ".yaml")
    return found if os.path.exists(found) else path


def check_keys(mapping, allowed, where, required=()):
    """Reject unknown keys and report missing ones, naming ``where``."""
    if not isinstance(mapping, dict):
        raise FormatError(f"{where}: expected a mapping, got {type(mapping).__name__} {mapping!r}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise FormatError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"allowed: {', '.join(sorted(allowed))}")
    missing = [key for key in required if key not in mapping]
    if missing:
        raise FormatError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")

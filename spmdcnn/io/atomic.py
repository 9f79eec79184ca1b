"""Files written aside and renamed into place: the file at a path is only ever replaced by a complete new one."""

import contextlib
import os
import re
import uuid


@contextlib.contextmanager
def written_aside(path):
    """``with written_aside(path) as temporary:`` write ``temporary`` (a new empty file beside ``path``); when the
    block ends normally it is flushed to disk and renamed over ``path``, else removed. Temporary files that killed
    writers left beside ``path`` are removed first."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    _remove_abandoned(path)
    temporary = _create_aside(path)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _remove_abandoned(path):
    """Remove the temporary files beside ``path`` that a process of this machine no longer running left (killed
    while writing): ``<path>.<pid>.<hex>.tmp``."""
    directory, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(name) + r"\.(\d+)\.[0-9a-f]{8}\.tmp$")
    for entry in os.listdir(directory):
        match = pattern.match(entry)
        if match and not _running(int(match.group(1))):
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # someone else's process
        return True
    return True


def _create_aside(path):
    """Create an empty, uniquely named file beside ``path`` with the ordinary permissions (umask applies)."""
    while True:
        temporary = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            os.close(os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return temporary
        except FileExistsError:
            continue


def _fsync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

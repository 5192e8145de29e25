"""Files written whole or not at all.

A file is written under a temporary name beside its final one, flushed to
disk, and renamed into place: a rename within a directory is atomic, so a
reader (or a resume after a kill) sees the old file or the new one, never half
of one. Standard library only, so any process (benchmarks, launch scripts)
can use it without loading TensorFlow.
"""
import contextlib
import json
import os


@contextlib.contextmanager
def temporary_path(path):
    """Yields a temporary path beside ``path``; when the block ends without an
    error, the file written there replaces ``path`` in one rename.

    The temporary name keeps ``path``'s suffix, for writers that insist on one
    (``keras.Model.save`` wants ``.keras``, ``np.savez`` appends ``.npz``).
    On an error the temporary file is removed and ``path`` is left as it was.

    Example::

        with temporary_path("run/model.keras") as tmp:
            model.save(tmp)
    """
    root, suffix = os.path.splitext(path)
    tmp = f"{root}.tmp-{os.getpid()}{suffix}"
    try:
        yield tmp
        # The data reaches the disk before the rename makes it count.
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_json(path, payload, **dump_options):
    """``json.dump(payload)`` to ``path``, atomically; ``dump_options`` go to ``json.dump``."""
    with temporary_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(payload, f, **dump_options)

"""Is a checkpoint intact? Shard digests, manifest reading, and what rotation may delete.

A disk that fills during a save, a copy cut short or bit rot on shared storage
leave a checkpoint that looks complete (its manifest exists) but cannot be
loaded. So the manifest records each shard's size and SHA-256
(``checksums``), and every reader checks the shards it will read against them
before loading anything (``hvd_easgd.checkpoint.latest``). A shard is read
once to check it: the cost of a resume's verification is one read of what the
resume loads anyway.

Manifests written before checksums existed (same format 2: the shards mean
what they meant) are checked by their zip CRC-32s instead, which numpy writes
for every array: that catches a cut-short or altered shard too, with a weaker
code.

Standard library only, and no communication: ``hvd_easgd.checkpoint`` makes
the ranks agree on these verdicts.
"""
import hashlib
import json
import os
import zipfile

MANIFEST = "manifest.json"
INTERRUPTED = f"an interrupted save (no {MANIFEST}), skipped by design"
_CHUNK = 1 << 20


def shard_digest(path):
    """``{"bytes": size, "sha256": hex digest}`` of the file at ``path``, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def buffer_digest(data):
    """``shard_digest`` of bytes in memory (a shard as it is written)."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class ManifestProblem(Exception):
    """A checkpoint directory whose manifest is missing, does not parse, or lacks a field."""


def read_manifest(directory):
    """The parsed ``manifest.json`` of ``directory``.

    Raises:
      ManifestProblem: with the reason, in a few words (``INTERRUPTED`` when there is none).
    """
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ManifestProblem(INTERRUPTED) from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ManifestProblem(f"{MANIFEST} does not parse ({err})") from None
    except OSError as err:
        raise ManifestProblem(f"{MANIFEST} cannot be read ({err})") from None
    if not isinstance(manifest, dict):
        raise ManifestProblem(f"{MANIFEST} does not parse (a {type(manifest).__name__}, not a mapping)")
    # "format" is checked by the reader, which names another or a missing one.
    missing = [key for key in ("epoch", "num_ranks", "shards") if key not in manifest]
    if missing:
        raise ManifestProblem(f"{MANIFEST} lacks {', '.join(missing)}")
    return manifest


def shards_read_by(manifest, rank, size):
    """The shard files rank ``rank`` of ``size`` ranks reads to resume from ``manifest``:
    its own at the saved number of ranks, else every saved shard (a resize maps them all)."""
    if manifest["num_ranks"] == size and rank < len(manifest["shards"]):
        return [manifest["shards"][rank]]
    return list(manifest["shards"])


def shard_problem(directory, file, recorded=None):
    """Why shard ``file`` of ``directory`` is not what ``recorded`` (its
    ``{"bytes", "sha256"}``) says, or None when it is. Without ``recorded`` (a
    manifest from before checksums), the zip CRC-32 of every array is checked."""
    path = os.path.join(directory, file)
    if not os.path.isfile(path):
        return f"{file} is missing"
    if recorded is None:
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return f"{file} is not a readable archive ({err})"
        return f"{file} fails the CRC-32 check of {bad}" if bad else None
    size = os.path.getsize(path)
    if size != recorded["bytes"]:
        return f"{file} holds {size} bytes, the manifest says {recorded['bytes']}"
    if shard_digest(path)["sha256"] != recorded["sha256"]:
        return f"{file}: SHA-256 differs from the manifest's (altered since it was written)"
    return None


def problem(directory, manifest, files=None):
    """The first reason the shards ``files`` (default: all the manifest lists) of
    ``directory`` are not intact, or None when they are."""
    checksums = manifest.get("checksums")
    for file in manifest["shards"] if files is None else files:
        reason = shard_problem(directory, file, checksums.get(file) if checksums is not None else None)
        if reason is None and checksums is not None and file not in checksums:
            reason = f"{file} has no checksum in the manifest"
        if reason:
            return reason
    return None


def outdated(verdicts, keep):
    """Names rotation deletes, given ``verdicts``: ``[(name, reason or None)]`` of
    the checkpoints with a manifest, oldest first, and ``keep`` (0: keep all).

    Only intact checkpoints count towards ``keep``, so rotation never deletes
    the last intact one: everything older than the ``keep``-th newest intact
    checkpoint goes (damaged ones with it); damaged ones newer than it stay
    (a resume skips them, and they are there to inspect).
    """
    intact = [i for i, (_, reason) in enumerate(verdicts) if reason is None]
    if keep <= 0 or len(intact) < keep:
        return []
    return [name for name, _ in verdicts[:intact[-keep]]]

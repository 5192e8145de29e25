"""A timeline of background collectives and train steps, in wall-clock seconds, and how much they overlap.

Transport-agnostic: the communicator's background worker (comm/background.py)
records each started allreduce's ``submit`` (the start's py_function),
``start`` and ``end`` (the worker ran it) and the caller's ``wait`` (the
finish blocked on it, or, on the blocking path, the start ran it); the
``StepTimeline`` callback records each train step's ``begin`` and ``end``.

``overlap_share`` is the question the timeline answers: of the time the
collectives ran, which share fell while a train step was computing? A step
computes during [begin, end] minus the times it was blocked in a collective
(the waits), so a blocking allreduce, which runs inside its step while the
step waits on it, scores 0, and one that runs wholly behind the next steps
scores 1.
"""
import threading


class Timeline:
    """Events appended from any thread; ``as_dict`` is what ``overlap_share`` reads (and the JSON)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.collectives = []  # {"handle", "submit", "start", "end"}
        self.waits = []  # {"handle", "begin", "end"}
        self.steps = []  # {"begin", "end"}

    def record_collective(self, handle, submit, start, end):
        with self._lock:
            self.collectives.append({"handle": int(handle), "submit": submit, "start": start, "end": end})

    def record_wait(self, handle, begin, end):
        with self._lock:
            self.waits.append({"handle": int(handle), "begin": begin, "end": end})

    def record_step(self, begin, end):
        with self._lock:
            self.steps.append({"begin": begin, "end": end})

    def as_dict(self):
        with self._lock:
            return {"collectives": list(self.collectives), "waits": list(self.waits), "steps": list(self.steps)}


def _union(intervals):
    merged = []
    for begin, end in sorted((b, e) for b, e in intervals if e > b):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return merged


def _minus(intervals, holes):
    """``intervals`` (disjoint, sorted) without the union of ``holes``."""
    holes = _union(holes)
    out = []
    for begin, end in intervals:
        for hole_begin, hole_end in holes:
            if hole_end <= begin or hole_begin >= end:
                continue
            if hole_begin > begin:
                out.append([begin, hole_begin])
            begin = max(begin, hole_end)
            if begin >= end:
                break
        if begin < end:
            out.append([begin, end])
    return out


def _overlap(begin, end, intervals):
    return sum(max(0.0, min(end, e) - max(begin, b)) for b, e in intervals)


def computing_intervals(timeline):
    """The times a train step computed: the steps' union minus the waits'."""
    steps = _union([(s["begin"], s["end"]) for s in timeline["steps"]])
    return _minus(steps, [(w["begin"], w["end"]) for w in timeline["waits"]])


def overlap_share(timeline):
    """Σ over collectives of their time while a step computed, over Σ of their time (0 without collectives).

    Args:
      timeline: ``Timeline.as_dict()``, or the JSON ``--timeline`` writes.
    """
    computing = computing_intervals(timeline)
    total = sum(c["end"] - c["start"] for c in timeline["collectives"])
    if total <= 0:
        return 0.0
    return sum(_overlap(c["start"], c["end"], computing) for c in timeline["collectives"]) / total

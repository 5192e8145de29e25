"""What a hand-written step really hands to Horovod, counted inside the graph.

hvd_easgd's strategies report their traffic through ``comm.account()``.
The baselines (raw Horovod, no communication) keep no account of their
own, and writing theirs down from the parameter count would only repeat
the analytic formula it is compared with. So their traffic is measured:
inside ``CollectiveCounter.counting()``, Horovod's collective functions are
replaced by wrappers that add, in the graph being traced, one call and the
payload bytes of the tensors actually passed. Each time the traced step
runs, the counters advance with it. A step that sent other tensors than
its model's gradients, or a second collective, or none at all, shows in
its row next to the analytic value.

The module attributes are looked up when a step is traced, so every call
that may trace a baseline's step runs inside ``counting()``; nothing else
is traced meanwhile (the worker runs one configuration at a time).
"""
import contextlib

import tensorflow as tf

# horovod.tensorflow's collective entry points; each takes its tensor (or
# list of tensors) first.
COLLECTIVES = ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
               "alltoall", "reducescatter", "grouped_reducescatter")


def payload_bytes(tensors):
    """Bytes of the tensor or tensors handed to one collective, as a graph value."""
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    return tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size for t in tensors])


class CollectiveCounter:
    """Calls and payload bytes of the collectives a step issues, per rank."""

    def __init__(self, module=None):
        if module is None:
            import horovod.tensorflow as module
        self._module = module
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.bytes = tf.Variable(0, dtype=tf.int64, trainable=False)

    def reset(self):
        self.calls.assign(0)
        self.bytes.assign(0)

    def account(self):
        return {"bytes": int(self.bytes.numpy()), "calls": int(self.calls.numpy()),
                "source": "counted at horovod.tensorflow's collectives"}

    def _counted(self, collective):
        def counted(tensors, *args, **kwargs):
            self.calls.assign_add(1)
            self.bytes.assign_add(payload_bytes(tensors))
            return collective(tensors, *args, **kwargs)

        return counted

    @contextlib.contextmanager
    def counting(self):
        """Horovod's collectives count into this counter while the block traces."""
        originals = {name: getattr(self._module, name) for name in COLLECTIVES if hasattr(self._module, name)}
        try:
            for name, collective in originals.items():
                setattr(self._module, name, self._counted(collective))
            yield self
        finally:
            for name, collective in originals.items():
                setattr(self._module, name, collective)


class TrafficAccount:
    """A configuration's traffic since the last ``reset``: counted at Horovod's
    collectives for a baseline (``counter`` given), else hvd_easgd's own
    ``comm.account()``."""

    def __init__(self, comm, counter=None):
        self.comm = comm
        self.counter = counter

    def tracing(self):
        """Where the configuration's step may be traced: a baseline's collectives are counted."""
        return self.counter.counting() if self.counter is not None else contextlib.nullcontext()

    def reset(self):
        if self.counter is not None:
            self.counter.reset()
        else:
            self.comm.reset_account()

    def account(self):
        """``{"bytes", "calls", "source"}``, per rank."""
        if self.counter is not None:
            return self.counter.account()
        return dict(self.comm.account(), source="comm.account()")

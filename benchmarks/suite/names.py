"""The configurations the suite compares: ONE table, and the groups derived from it.

Each row names a configuration, says what it is, how to build its strategy
(a factory with explicit parameters; none for the baselines, which call
Horovod themselves), the ``train.py`` flags that train like it (its
time-to-accuracy rows take ``--scale-lr``'s rule from the strategy those
flags build) and the groups of the suite it belongs to. Everything else (the
expected traffic, whether it splits the ranks into process groups) is asked
of the strategy the factory builds.

No TensorFlow here: ``compare.py`` (which never imports it) derives its
default number of repeats from how many configurations each group holds. The
factories name ``hvd_easgd``'s strategies through the package's lazy
attributes, so TensorFlow loads only when one is called.
"""
from dataclasses import dataclass

import hvd_easgd


@dataclass(frozen=True)
class Configuration:
    """One row of the table.

    Attributes:
      name: the configuration's name (``--configs``, the results' ``config``).
      description: one line for the report.
      make_strategy: builds its hvd_easgd strategy; None for a baseline.
      sends_like: for a baseline, the strategy whose traffic it sends (raw
        Horovod: SyncAverage's one grouped allreduce); None sends nothing.
      train_py: the ``train.py`` flags that train like it; () for none.
      groups: the suite's groups it belongs to (``CUSTOM_LOOP``'s parts, ``FIT``, ...).
    """

    name: str
    description: str
    make_strategy: object = None
    sends_like: object = None
    train_py: tuple = ()
    groups: tuple = ()

    @property
    def is_baseline(self):
        return self.make_strategy is None

    def flag(self, name):
        """The value after ``name`` in its train.py flags, or None where it has no such flag."""
        return self.train_py[self.train_py.index(name) + 1] if name in self.train_py else None

    def traffic_strategy(self):
        """The strategy whose ``expected_traffic`` this configuration's is, or None."""
        make = self.make_strategy or self.sends_like
        return None if make is None else make()


def _sync():
    return hvd_easgd.SyncAverage()


def _easgd(tau, overlap=False):
    return lambda: hvd_easgd.EASGD(period=tau, overlap=overlap)


# Hierarchical's groups are the hosts; on one host it is SyncAverage, so it runs in --topology suites only.
# Its time-to-accuracy rows train as the flat strategy of its inter level at p ranks (train.py refuses
# --scale-lr for Hierarchical): both of its configurations average the gradients or the weights of all p ranks.
TABLE = (
    Configuration("no_comm", "each rank trains alone, no communication (ceiling)",
                  groups=("baseline", "topology_suite")),
    Configuration("raw_horovod", "hand-written step, hvd.grouped_allreduce inside the tf.function",
                  sends_like=_sync, groups=("baseline",)),
    Configuration("sync", "hvd_easgd SyncAverage", _sync, train_py=("--strategy", "sync"),
                  groups=("strategy", "topology_suite")),
    Configuration("easgd_tau4", "hvd_easgd EASGD tau=4", _easgd(4), train_py=("--strategy", "easgd", "--tau", "4"),
                  groups=("strategy",)),
    Configuration("easgd_tau10", "hvd_easgd EASGD tau=10", _easgd(10),
                  train_py=("--strategy", "easgd", "--tau", "10"), groups=("strategy", "topology_suite")),
    Configuration("easgd_tau10_overlap",
                  "hvd_easgd EASGD tau=10, overlap=True (allreduce issued before the inner update)",
                  _easgd(10, overlap=True), train_py=("--strategy", "easgd", "--tau", "10", "--overlap", "1"),
                  groups=("strategy",)),
    Configuration("accum4_sync", "hvd_easgd GradientAccumulation k=4 over SyncAverage",
                  lambda: hvd_easgd.GradientAccumulation(4, strategy=hvd_easgd.SyncAverage()),
                  train_py=("--strategy", "sync", "--accumulate", "4"), groups=("strategy",)),
    Configuration("sync_two_level", "hvd_easgd Hierarchical(SyncAverage, SyncAverage): the two-level allreduce",
                  lambda: hvd_easgd.Hierarchical(intra=hvd_easgd.SyncAverage(), inter=hvd_easgd.SyncAverage()),
                  train_py=("--strategy", "sync"), groups=("hierarchical",)),
    Configuration("hier_easgd_tau10", "hvd_easgd Hierarchical(SyncAverage within a host, EASGD tau=10 across hosts)",
                  lambda: hvd_easgd.Hierarchical(intra=hvd_easgd.SyncAverage(),
                                                 inter=hvd_easgd.EASGD(period=10)),
                  train_py=("--strategy", "easgd", "--tau", "10"), groups=("hierarchical",)),
    Configuration("periodic_tau10", "hvd_easgd PeriodicAverage tau=10 (local SGD)",
                  lambda: hvd_easgd.PeriodicAverage(period=10), train_py=("--strategy", "periodic", "--tau", "10"),
                  groups=("topology",)),
    Configuration("diloco_tau10", "hvd_easgd DiLoCo tau=10 (outer Nesterov SGD, hvd_easgd's defaults)",
                  lambda: hvd_easgd.DiLoCo(period=10), train_py=("--strategy", "diloco", "--tau", "10"),
                  groups=("topology",)),
    # Streaming DiLoCo: the same period, the variables in 4 fragments, one fragment synchronised at a time
    # (the same bytes per period, spread over it); run with --configs (the time to accuracy of issue 25).
    Configuration("diloco_tau10_f4", "hvd_easgd DiLoCo tau=10, 4 fragments (Streaming DiLoCo)",
                  lambda: hvd_easgd.DiLoCo(period=10, fragments=4),
                  train_py=("--strategy", "diloco", "--tau", "10", "--fragments", "4"), groups=("streaming",)),
    # Overlap twins (--overlap δ: the collective runs on the communicator's worker while δ steps compute;
    # docs/strategies.md, Overlap), run with --configs beside their twins without overlap. On the teacher
    # workload a step computes c ≈ 12 ms at 2 × 256 samples and one fp32 allreduce of its 1.09 M parameters
    # takes ≈ 0.55 s at ~63 Mbit/s: full hiding needs δ·c ≥ 0.55 s, δ ≥ 46, so τ = 50 (δ < τ); at τ = 10,
    # δ = 9 hides at most 9 · 12 = 108 ms of each synchronisation.
    Configuration("easgd_tau10_overlap9", "hvd_easgd EASGD tau=10, overlap 9 steps",
                  _easgd(10, overlap=9), train_py=("--strategy", "easgd", "--tau", "10", "--overlap", "9"),
                  groups=("overlap",)),
    Configuration("periodic_tau10_overlap9", "hvd_easgd PeriodicAverage tau=10, overlap 9 steps",
                  lambda: hvd_easgd.PeriodicAverage(period=10, overlap=9),
                  train_py=("--strategy", "periodic", "--tau", "10", "--overlap", "9"), groups=("overlap",)),
    Configuration("easgd_tau50", "hvd_easgd EASGD tau=50", _easgd(50),
                  train_py=("--strategy", "easgd", "--tau", "50"), groups=("overlap",)),
    Configuration("easgd_tau50_overlap46", "hvd_easgd EASGD tau=50, overlap 46 steps",
                  _easgd(50, overlap=46), train_py=("--strategy", "easgd", "--tau", "50", "--overlap", "46"),
                  groups=("overlap",)),
    Configuration("periodic_tau50", "hvd_easgd PeriodicAverage tau=50 (local SGD)",
                  lambda: hvd_easgd.PeriodicAverage(period=50),
                  train_py=("--strategy", "periodic", "--tau", "50"), groups=("overlap",)),
    Configuration("periodic_tau50_overlap46", "hvd_easgd PeriodicAverage tau=50, overlap 46 steps",
                  lambda: hvd_easgd.PeriodicAverage(period=50, overlap=46),
                  train_py=("--strategy", "periodic", "--tau", "50", "--overlap", "46"), groups=("overlap",)),
    # Streaming DiLoCo with overlap: the teacher workload's 2 fragments of ≈ 2.2 MB syncing alternately every 25
    # steps, each crossing a 2-host link in ≈ 0.28 s at 62 Mbit/s behind δ = 24 steps of compute (the overlap
    # page works it out from its run); δ < ⌊τ/F⌋ keeps one sync in flight.
    Configuration("diloco_tau50_f2", "hvd_easgd DiLoCo tau=50, 2 fragments (Streaming DiLoCo)",
                  lambda: hvd_easgd.DiLoCo(period=50, fragments=2),
                  train_py=("--strategy", "diloco", "--tau", "50", "--fragments", "2"), groups=("overlap",)),
    Configuration("diloco_tau50_f2_overlap24", "hvd_easgd DiLoCo tau=50, 2 fragments, overlap 24 steps",
                  lambda: hvd_easgd.DiLoCo(period=50, fragments=2, overlap=24),
                  train_py=("--strategy", "diloco", "--tau", "50", "--fragments", "2", "--overlap", "24"),
                  groups=("overlap",)),
    # What crosses the wire (docs/compression.md): the compressed twins of the rows above.
    Configuration("sync_int8", "hvd_easgd SyncAverage, int8 gradients (block-scaled, error feedback)",
                  lambda: hvd_easgd.SyncAverage(compression="int8"),
                  train_py=("--strategy", "sync", "--compression", "int8"), groups=("compression",)),
    Configuration("sync_powersgd4", "hvd_easgd SyncAverage, PowerSGD rank 4 (after its uncompressed warm-up)",
                  lambda: hvd_easgd.SyncAverage(compression="powersgd", powersgd_rank=4),
                  train_py=("--strategy", "sync", "--compression", "powersgd", "--powersgd-rank", "4"),
                  groups=("compression",)),
    Configuration("diloco_tau10_int8", "hvd_easgd DiLoCo tau=10, int8 pseudo-gradients",
                  lambda: hvd_easgd.DiLoCo(period=10, compression="int8"),
                  train_py=("--strategy", "diloco", "--tau", "10", "--compression", "int8"), groups=("compression",)),
    Configuration("diloco_tau10_int4", "hvd_easgd DiLoCo tau=10, int4 pseudo-gradients",
                  lambda: hvd_easgd.DiLoCo(period=10, compression="int4"),
                  train_py=("--strategy", "diloco", "--tau", "10", "--compression", "int4"), groups=("compression",)),
    Configuration("diloco_tau10_topk", "hvd_easgd DiLoCo tau=10, top-k pseudo-gradients (1/64 of each chunk, "
                  "2 bits, error feedback)", lambda: hvd_easgd.DiLoCo(period=10, compression="topk"),
                  train_py=("--strategy", "diloco", "--tau", "10", "--compression", "topk"), groups=("compression",)),
    Configuration("raw_horovod_fit", "model.fit with an SGD whose apply calls hvd.grouped_allreduce first",
                  sends_like=_sync, groups=("fit",)),
    Configuration("sync_fit", "model.fit with hvd_easgd's DistributedOptimizer(SyncAverage)", _sync,
                  groups=("fit",)),
)
BY_NAME = {row.name: row for row in TABLE}


def group(name):
    """The names of the table's rows in group ``name``, in the table's order."""
    return tuple(row.name for row in TABLE if name in row.groups)


STRATEGIES = group("strategy")
BASELINES = group("baseline")
CUSTOM_LOOP = BASELINES + STRATEGIES
# The strategies for clusters of several hosts, run by ``--topology``
# on the virtual cluster; not in the single-host suite's default, where a
# Hierarchical strategy has one group and is SyncAverage.
HIERARCHICAL = group("hierarchical")  # they split the ranks into groups (process sets)
TOPOLOGY = HIERARCHICAL + group("topology")
# Compressed payloads: run across rated links with --configs (docs/wire-results.md: the wire runs).
COMPRESSION = group("compression")
STREAMING = group("streaming")
OVERLAP = group("overlap")  # the overlap twins: run across rated links with --configs
ALL_CUSTOM_LOOP = CUSTOM_LOOP + TOPOLOGY + COMPRESSION + STREAMING + OVERLAP
# What a --topology run compares: the flat references, then the topology strategies.
TOPOLOGY_SUITE = group("topology_suite") + TOPOLOGY
FIT = group("fit")

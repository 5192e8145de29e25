"""The names of the configurations the suite compares, in one place.

No TensorFlow here: ``compare.py`` (which never imports it) derives its
default number of repeats from how many configurations each group holds.
"""
STRATEGIES = ("sync", "easgd_tau4", "easgd_tau10", "easgd_tau10_overlap", "accum4_sync")
BASELINES = ("no_comm", "raw_horovod")
CUSTOM_LOOP = BASELINES + STRATEGIES
# The strategies for clusters of several hosts, run by ``--topology``
# on the virtual cluster; not in the single-host suite's default, where a
# Hierarchical strategy has one group and is SyncAverage.
TOPOLOGY = ("sync_two_level", "hier_easgd_tau10", "periodic_tau10", "diloco_tau10")
ALL_CUSTOM_LOOP = CUSTOM_LOOP + TOPOLOGY
# What a --topology run compares: the flat references, then the topology strategies.
TOPOLOGY_SUITE = ("no_comm", "sync", "easgd_tau10") + TOPOLOGY
FIT = ("raw_horovod_fit", "sync_fit")

"""The names of the configurations the suite compares, in one place.

No TensorFlow here: ``compare.py`` (which never imports it) derives its
default number of repeats from how many configurations each group holds.
"""
STRATEGIES = ("sync", "easgd_tau4", "easgd_tau10", "easgd_tau10_overlap", "accum4_sync")
BASELINES = ("no_comm", "raw_horovod")
CUSTOM_LOOP = BASELINES + STRATEGIES
FIT = ("raw_horovod_fit", "sync_fit")

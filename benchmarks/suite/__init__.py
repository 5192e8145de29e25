"""The suite: the strategies side by side against raw Horovod, MWMS and no communication.

``python -m benchmarks compare`` (``compare.py``) starts one launch per (np, controller) of
``worker.py``, which times every configuration (``names.py``'s table, built by
``configurations.py`` and ``fit_variants.py``) interleaved in a Williams design (``order.py``),
counting the collectives each really makes (``collective_count.py``, ``host_traffic.py``); then the
allreduce microbenchmark (``allreduce.py``) and TensorFlow's MWMS baseline (``mwms.py``), or the
same across the virtual cluster's rated links (``rated_links.py``). ``report.py``, ``plots.py`` and
``curves.py`` turn what was measured into results.md and its figures; ``machine.py`` records what it
ran on and whether the machine was quiet. ``runner.py`` is the one launcher, bound and summary every
benchmark program uses; ``committed.py`` writes, or compares with ``--check``, the files a program
renders and commits.

May import: ``hvd_easgd`` and third-party packages only. Nothing in ``costmodel``, ``accuracy`` or
``studies``: they build on the suite, not the other way round.
"""

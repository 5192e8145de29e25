"""Choosing for the user: ``--strategy auto`` (``hvd_easgd.auto()``) prices each candidate and picks one.

    auto_strategy.py   the candidates, each one's predicted step, the rule that chooses
    cost_model.py      the α–β cost of a step at H hosts × n ranks (standard library only); the
                       benchmarks' projection shares it
    link_probe.py      a link's B (one large allreduce) and α (a sweep of small ones), per level

Imports ``strategies``, ``startup`` and the top-level modules (``compute_timing``), nothing above them.
This file imports nothing: the cost model loads without TensorFlow.
"""

"""The ``powersgd`` choice of ``--compression``: the choice and its rank.

PowerSGD (Vogels et al. 2019, arXiv:1905.13727) sends rank-R factors of
each gradient matrix; the factors are summed by the ordinary allreduce. It
applies to gradients only (SyncAverage). Its compressor is
``hvd_easgd/comm/powersgd.py`` (``PowerSGD``), which SyncAverage builds from
this choice; ``DEFAULT_RANK`` here is the one default of both.
"""
from ... import validation
from .kinds import GRADIENTS

DEFAULT_RANK = 4


class PowerSGDChoice:
    """``--compression powersgd --powersgd-rank R``: what SyncAverage builds its compressor from."""

    name = "powersgd"
    summable = True
    applies_to = frozenset({GRADIENTS})

    def __init__(self, rank=DEFAULT_RANK):
        self.rank = validation.integer("powersgd_rank", rank, minimum=1)

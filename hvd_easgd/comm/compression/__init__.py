"""What crosses the wire: the formats of ``--compression``.

Each format answers for itself:

* ``name``: its ``--compression`` choice;
* ``summable``: whether its payload can be summed as it travels (none and
  fp16: the ordinary allreduce; bf16, int8 and int4: not, they go through
  the quantised allreduce, ``comm/quantised_allreduce.py``);
* ``applies_to``: the kinds of payload it may carry (``kinds.py``); a
  strategy refuses, in one line, a format that does not apply to its own;
* what an element costs on the wire: ``wire_itemsize(dtype)`` for the
  summable ones, ``block_size`` elements in ``block_bytes`` bytes (scales
  included) for the others, whose payload bytes are
  ``quantised_allreduce.message_bytes``.

=========  ================  ===============  =================
format     bytes / element   scale            summed as it goes
=========  ================  ===============  =================
none       4 (fp32)          --               yes
fp16       2                 --               yes
bf16       2                 --               no (Horovod has no bf16)
int8       (256 + 4) / 256   fp32 per 256     no (integer sums overflow)
int4       (128 + 4) / 256   fp32 per 256     no
powersgd   rank-R factors    --               yes (SyncAverage only)
=========  ================  ===============  =================
"""
from .blocks import BLOCK_SIZE, Int4Compression, Int8Compression
from .casts import BF16Compression, FP16Compression, NoCompression
from .kinds import EVERY_PAYLOAD, GRADIENTS
from .powersgd_choice import DEFAULT_RANK as POWERSGD_DEFAULT_RANK, PowerSGDChoice

COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4", "powersgd")


class Compression:
    """Named choices, as Horovod spells them: ``Compression.none``, ``Compression.int8``, ..."""

    none = NoCompression()
    fp16 = FP16Compression()
    bf16 = BF16Compression()
    int8 = Int8Compression()
    int4 = Int4Compression()

    @classmethod
    def by_name(cls, name, **options):
        """The format called ``name`` (one of ``COMPRESSIONS``); ``options`` are
        PowerSGD's (``rank``)."""
        if name == "powersgd":
            return PowerSGDChoice(**options)
        if name not in COMPRESSIONS:
            raise ValueError(f"`compression` must be one of {list(COMPRESSIONS)}. Received: compression={name!r}")
        return getattr(cls, name)


__all__ = ["BLOCK_SIZE", "COMPRESSIONS", "POWERSGD_DEFAULT_RANK", "PowerSGDChoice", "Compression", "EVERY_PAYLOAD", "GRADIENTS"]

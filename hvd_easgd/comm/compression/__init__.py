"""What crosses the wire: the formats of ``--compression``.

Each format answers for itself:

* ``name``: its ``--compression`` choice;
* ``summable``: whether its payload can be summed as it travels (none and
  fp16: the ordinary allreduce; bf16, int8, int4 and sign: not, they go through
  the quantised allreduce, ``comm/quantised_allreduce.py``; topk: not, it
  goes through the sparse allreduce, ``comm/sparse_allreduce.py``);
* ``sparse`` (those that cannot be summed): whether each rank sends a
  subset of its elements (topk), whose collective is the sparse allreduce;
* ``options``: what it is made from besides its name (topk's density and
  bits), so that ``config_of`` and ``Compression.of`` round-trip it;
* ``applies_to``: the kinds of payload it may carry (``kinds.py``); a
  strategy refuses, in one line, a format that does not apply to its own;
* what an element costs on the wire: ``wire_itemsize(dtype)`` for the
  summable ones, ``block_size`` elements in ``block_bytes`` bytes (scales
  included) for the quantising ones, whose payload bytes are
  ``quantised_allreduce.message_bytes``; ``message_bytes`` for topk.

=========  ================  ===============  =================
format     bytes / element   scale            summed as it goes
=========  ================  ===============  =================
none       4 (fp32)          --               yes
fp16       2                 --               yes
bf16       2                 --               no (Horovod has no bf16)
int8       (256 + 4) / 256   fp32 per 256     no (integer sums overflow)
int4       (128 + 4) / 256   fp32 per 256     no
sign       (256 + 4) / 2048  fp32 per 2048    no (local updates only)
powersgd   rank-R factors    --               yes (SyncAverage only)
topk       (12 + B)·D bits   fp32 per 4095    no (positions differ; DiLoCo, EASGD)
=========  ================  ===============  =================
"""
from .blocks import BLOCK_SIZE, Int4Compression, Int8Compression, SignCompression
from .casts import BF16Compression, FP16Compression, NoCompression
from .kinds import EVERY_PAYLOAD, GRADIENTS
from .powersgd_choice import DEFAULT_RANK as POWERSGD_DEFAULT_RANK, PowerSGDChoice
from .topk import BITS as TOPK_BITS, DEFAULT_BITS as TOPK_DEFAULT_BITS, DEFAULT_DENSITY as TOPK_DEFAULT_DENSITY, \
    TopKCompression

COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4", "sign", "powersgd", "topk")


class Compression:
    """Named choices, as Horovod spells them: ``Compression.none``, ``Compression.int8``, ..."""

    none = NoCompression()
    fp16 = FP16Compression()
    bf16 = BF16Compression()
    int8 = Int8Compression()
    int4 = Int4Compression()
    sign = SignCompression()
    topk = TopKCompression()  # at its defaults; other options: by_name("topk", density=D, bits=B)

    @classmethod
    def by_name(cls, name, **options):
        """The format called ``name`` (one of ``COMPRESSIONS``); ``options`` are
        PowerSGD's (``rank``) or topk's (``density``, ``bits``)."""
        if name == "powersgd":
            return PowerSGDChoice(**options)
        if name == "topk" and options:
            return TopKCompression(**options)
        if name not in COMPRESSIONS:
            raise ValueError(f"`compression` must be one of {list(COMPRESSIONS)}. Received: compression={name!r}")
        return getattr(cls, name)

    @classmethod
    def of(cls, spec):
        """The format ``spec`` names: a format itself, a name, or what ``config_of`` made of one
        (``{"name": "topk", "density": D, "bits": B}``)."""
        if isinstance(spec, str):
            return cls.by_name(spec)
        if isinstance(spec, dict):
            options = dict(spec)
            return cls.by_name(options.pop("name", None), **options)
        return spec


def config_of(choice):
    """What a strategy's ``get_config`` keeps of the format ``choice``: its name, or for a format made
    from options (topk) ``{"name": ..., **options}``; ``Compression.of`` takes either back."""
    options = getattr(choice, "options", None)
    return {"name": choice.name, **options} if options else choice.name


__all__ = ["BLOCK_SIZE", "COMPRESSIONS", "POWERSGD_DEFAULT_RANK", "PowerSGDChoice", "Compression", "EVERY_PAYLOAD",
           "GRADIENTS", "TOPK_BITS", "TOPK_DEFAULT_BITS", "TOPK_DEFAULT_DENSITY", "TopKCompression", "config_of"]

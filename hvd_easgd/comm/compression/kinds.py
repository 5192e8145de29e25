"""What a strategy sends, by kind: a format says which kinds it applies to.

A strategy names the kind of its payload (``SyncStrategy.payload_kind``)
and refuses a format that does not apply to it, in one line.
"""
GRADIENTS = "gradients"                    # SyncAverage
ELASTIC_DIFFERENCES = "elastic differences"  # EASGD: alpha (x_i - center)
WEIGHT_DIFFERENCES = "weight differences"    # PeriodicAverage: x_i - last synchronised weights
PSEUDO_GRADIENTS = "pseudo-gradients"        # DiLoCo: synced - x_i

EVERY_PAYLOAD = frozenset({GRADIENTS, ELASTIC_DIFFERENCES, WEIGHT_DIFFERENCES, PSEUDO_GRADIENTS})

"""``python -m hvd_easgd.install``: the ``hvd-easgd`` command without its script."""
import sys

from .cli import main

sys.exit(main())

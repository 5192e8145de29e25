"""One-off investigations, apart from the suite: see README.md beside this file. ``digits_cnn.py`` is no
study: it builds the model two of their workers train.

May import: ``hvd_easgd`` (train.py's application too, for its models and datasets) and every other
part, ``suite``, ``costmodel`` and ``accuracy``. Nothing imports a study.
"""

"""What a strategy does to a model's quality, and how soon it reaches a target; the pages rendered from it.

Its studies launch train.py through one runner, ``study.py`` (seeds, run dirs, resume of a half-done
study, the quiet-machine check, the record of each command; its docstring says how a study is written),
and keep only what differs: ``accuracy.py`` (train.py's compressed variants against their fp32 twins),
``parity.py`` (a real workload's final loss or accuracy against SyncAverage's; ``parity_by_np.py``
sets its folders at several np side by side), ``time_to_target.py``
(the language model's time to a target loss across rated links), ``slow_rank.py`` (one rank twice as
slow, with and without ``--balance speed``; ``slow_hook.py`` slows it) and ``long_run.py`` (the
language model's memory over half an hour). ``teacher_calibration.py`` (the teacher workload's step
and time to accuracy), ``tta_report.py`` (the time-to-accuracy page from the rated-link runs) and
``defaults_report.py`` (the pages of what a user gets at the defaults: collectives, training at n
ranks, the suite's headline run) render pages from committed results.

May import: ``hvd_easgd``, ``benchmarks.suite`` (the runner, the rated links, the suite's report and
plots) and ``benchmarks.costmodel`` (the workloads the time-to-accuracy page names). Not ``studies``.
"""

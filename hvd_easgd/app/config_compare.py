"""Does a saved run fit the run about to resume it? The comparison of two configs.

A config here is ``cli.effective_config``'s mapping: every option as it takes
effect, under its flag name (``batch_size``, ``tau``), plus ``run_dir``.
Standard library only: the strategy is handed in and answers for its own
resize rule.
"""

# Options a resumed run may change: where and how long it runs, how it reports
# and saves. Every other option changes what is trained, so it must match.
RESUMABLE_KEYS = frozenset({
    "epochs", "run_dir", "resume", "config", "checkpoint_every", "keep_checkpoints", "eval_every",
    "threads_per_rank", "verbose", "max_bad_steps", "tensorboard", "step_timeline", "checkpoint_every_steps",
    "checkpoint_every_minutes", "checkpoint_on_signal", "agree_every", "stop_grace_seconds", "auto_resume",
    "collectives",  # how the bytes travel, not what is trained
    "elastic", "elastic_commit_every",  # how the job survives a dead rank, not what is trained
    "plugin",  # the modules imported: what they register is compared as --strategy
    "sample_shares",  # measured at start-up (--balance speed); a resize measures them anew
})


# Options added after runs were saved without them: a saved config that lacks
# one ran with this value (the option's default, which is what it did then).
ADDED_LATER = {"compression": "none", "powersgd_rank": 4,
               # --compression topk's (a run saved before it sent no top-k)
               "density": 1 / 64, "bits": 2,
               # the language model's (a run saved before them trained images at a constant rate)
               "context": 128, "layers": 2, "width": 64, "heads": 4, "lr_schedule": "constant",
               "lr_warmup_updates": None, "lr_floor": 0.1,
               # --strategy auto's (a run saved before it chose nothing)
               "auto_utilisation": 0.9, "auto_choice": None,
               # --balance's (a run saved before it gave every rank an equal share)
               "balance": "off", "sample_shares": None,
               # --train-fraction's (a run saved before it trained on the whole training split)
               "train_fraction": 1.0}


# Options whose default changed, named in a config since (``SyncStrategy.implied_options``): a saved
# config that lacks one where the current one names it ran with this value, and resumes with it.
CHANGED_DEFAULTS = {
    # Streaming DiLoCo's overlapped merge: "mix" until the language model's 3-seed table chose "progress".
    "overlap_merge": "mix",
    # DiLoCo's warm-up: none until it followed the learning rate's (DiLoCo.default_warmup_steps).
    "warmup_steps": 0}


def config_differences(saved, current):
    """Keys (other than the resumable ones) whose values differ, sorted."""
    older = {**ADDED_LATER, **CHANGED_DEFAULTS}
    saved = {**{k: v for k, v in older.items() if k in current}, **saved}
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def resize_refusal(manifest, strategy, num_ranks):
    """Why the checkpoint described by ``manifest`` cannot resume at ``num_ranks``
    ranks (another number than it was saved at), or None when it can.

    The strategy answers for its state (``strategy.resize_refusal``: every
    built-in resumes; EASGD refuses a fixed ``--moving-rate`` exactly where
    ``EASGD(...)`` itself would at the new size, Hierarchical a
    ``--ranks-per-group`` that does not divide it). At an epoch end and
    mid-epoch alike: the rest of a started epoch is split over the new ranks
    (``data.rest_of_epoch``), and an open accumulation window carries its
    partial sums (``GradientAccumulation.resize_refusal``).
    """
    return strategy.resize_refusal(manifest["num_ranks"], num_ranks) or None


# Options that may change where the manifest records the process groups the
# strategy's state was kept in (the state is then mapped to the new groups).
REGROUPABLE_KEYS = frozenset({"ranks_per_group"})


def resume_mismatches(manifest, config, num_ranks, strategy):
    """What keeps the checkpoint described by ``manifest`` from continuing a run
    of ``config`` with ``strategy`` on ``num_ranks`` ranks; empty when it fits.
    Another ``--ranks-per-group`` fits a checkpoint whose manifest names its
    groups (``process_groups``), and not an older one (whose layout is unknown)."""
    differs = config_differences(manifest["config"], config)
    if "process_groups" in manifest:
        differs = [key for key in differs if key not in REGROUPABLE_KEYS]
    if manifest["num_ranks"] != num_ranks:
        reason = resize_refusal(manifest, strategy, num_ranks)
        if reason:
            differs = [f"number of ranks ({manifest['num_ranks']} saved, {num_ranks} now): {reason}"] + differs
    return differs

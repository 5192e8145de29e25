"""Does a saved run fit the run about to resume it? The comparison of two configs.

A config here is ``cli.effective_config``'s mapping: every option as it takes
effect, under its flag name (``batch_size``, ``tau``), plus ``run_dir``.
Standard library only.
"""

# Options a resumed run may change: where and how long it runs, how it reports
# and saves. Every other option changes what is trained, so it must match.
RESUMABLE_KEYS = frozenset({
    "epochs", "run_dir", "resume", "config", "checkpoint_every", "keep_checkpoints", "eval_every",
    "threads_per_rank", "verbose", "max_bad_steps", "tensorboard", "checkpoint_every_steps",
    "checkpoint_every_minutes", "checkpoint_on_signal", "agree_every", "stop_grace_seconds", "auto_resume",
    "collectives",  # how the bytes travel, not what is trained
})

# Strategies whose checkpoint resumes at another number of ranks (``checkpoint.restore``
# maps the p saved shards onto q ranks).
RESIZABLE_STRATEGIES = frozenset({"sync", "easgd"})


def config_differences(saved, current):
    """Keys (other than the resumable ones) whose values differ, sorted."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def resize_refusal(manifest, config, num_ranks=None):
    """Why the checkpoint described by ``manifest`` cannot resume at ``num_ranks``
    ranks (another number than it was saved at), or None when it can.

    SyncAverage, with or without accumulation: every rank saved the same state.
    EASGD, with or without accumulation: the center is kept and every rank's
    local weights restart from it (``checkpoint.restore`` says how each array
    is mapped); alpha is beta/q again, so a ``--moving-rate`` fixed by the user
    must still give q * alpha < 1 at the new size.

    Only from an epoch end: mid-epoch, each rank's shard of that epoch's order
    depends on the number of ranks, and an accumulation window may be open.
    """
    strategy = config.get("strategy")
    if strategy not in RESIZABLE_STRATEGIES:
        return (f"--strategy {strategy} keeps state per rank that has no rule for another number of ranks; "
                f"only --strategy {' or '.join(sorted(RESIZABLE_STRATEGIES))} resume at another number of ranks")
    step = manifest.get("step_in_epoch", 0)
    if step:
        return (f"the checkpoint is mid-epoch (micro-batch {step} of epoch {manifest['epoch'] + 1}), and the "
                "epoch's shards depend on the number of ranks; resume from an epoch-end checkpoint (epoch-E)")
    alpha = config.get("moving_rate")
    if strategy == "easgd" and alpha is not None and num_ranks is not None and num_ranks * alpha >= 1:
        return (f"--moving-rate {alpha} was fixed for {manifest['num_ranks']} ranks, and at {num_ranks} ranks "
                f"q * alpha = {num_ranks * alpha:.6g} >= 1: each elastic step would move the center onto or past "
                f"the workers' mean, so it no longer averages; resume at {_most_ranks_for(alpha)} "
                "ranks or fewer, or start a new run with --beta (alpha = beta/q)")
    return None


def _most_ranks_for(alpha):
    """The largest q with q * alpha < 1."""
    q = int(1 / alpha)
    return q - 1 if q * alpha >= 1 else q


def resume_mismatches(manifest, config, num_ranks):
    """What keeps the checkpoint described by ``manifest`` from continuing a run
    of ``config`` on ``num_ranks`` ranks; empty when it fits."""
    differs = config_differences(manifest["config"], config)
    if manifest["num_ranks"] != num_ranks:
        reason = resize_refusal(manifest, config, num_ranks)
        if reason:
            differs = [f"number of ranks ({manifest['num_ranks']} saved, {num_ranks} now): {reason}"] + differs
    return differs

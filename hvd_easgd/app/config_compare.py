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
    "threads_per_rank", "verbose", "max_bad_steps", "tensorboard", "checkpoint_every_steps",
    "checkpoint_every_minutes", "checkpoint_on_signal", "agree_every", "stop_grace_seconds", "auto_resume",
    "collectives",  # how the bytes travel, not what is trained
    "elastic", "elastic_commit_every",  # how the job survives a dead rank, not what is trained
    "plugin",  # the modules imported: what they register is compared as --strategy
})


def config_differences(saved, current):
    """Keys (other than the resumable ones) whose values differ, sorted."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def resize_refusal(manifest, strategy, num_ranks):
    """Why the checkpoint described by ``manifest`` cannot resume at ``num_ranks``
    ranks (another number than it was saved at), or None when it can.

    The strategy answers for its state (``strategy.resize_refusal``: SyncAverage
    and EASGD, with or without accumulation, resume; EASGD refuses a fixed
    ``--moving-rate`` exactly where ``EASGD(...)`` itself would at the new size).
    Only from an epoch end, whatever the strategy: mid-epoch, each rank's shard
    of that epoch's order depends on the number of ranks, and an accumulation
    window may be open.
    """
    reason = strategy.resize_refusal(manifest["num_ranks"], num_ranks)
    if reason:
        return reason
    step = manifest.get("step_in_epoch", 0)
    if step:
        return (f"the checkpoint is mid-epoch (micro-batch {step} of epoch {manifest['epoch'] + 1}), and the "
                "epoch's shards depend on the number of ranks; resume from an epoch-end checkpoint (epoch-E)")
    return None


def resume_mismatches(manifest, config, num_ranks, strategy):
    """What keeps the checkpoint described by ``manifest`` from continuing a run
    of ``config`` with ``strategy`` on ``num_ranks`` ranks; empty when it fits."""
    differs = config_differences(manifest["config"], config)
    if manifest["num_ranks"] != num_ranks:
        reason = resize_refusal(manifest, strategy, num_ranks)
        if reason:
            differs = [f"number of ranks ({manifest['num_ranks']} saved, {num_ranks} now): {reason}"] + differs
    return differs

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


def config_differences(saved, current):
    """Keys (other than the resumable ones) whose values differ, sorted."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def resize_refusal(manifest, config):
    """Why the checkpoint described by ``manifest`` cannot resume exactly at another
    number of ranks, or None when it can.

    It can when every rank saved the same state, so any number of ranks can
    take rank 0's: SyncAverage (with or without accumulation) at an epoch end,
    where the accumulation window is closed and BatchNorm statistics were just
    averaged. Mid-epoch, each rank's shard of that epoch's order depends on the
    number of ranks; EASGD's local weights, optimizer slots and moving rate
    alpha are per rank and per size.
    """
    if config.get("strategy") != "sync":
        return (f"--strategy {config.get('strategy')} keeps per-rank state (EASGD's local weights and slots, "
                "alpha for the saved size); only --strategy sync resumes at another number of ranks in this release")
    step = manifest.get("step_in_epoch", 0)
    if step:
        return (f"the checkpoint is mid-epoch (micro-batch {step} of epoch {manifest['epoch'] + 1}), and the "
                "epoch's shards depend on the number of ranks; resume from an epoch-end checkpoint (epoch-E)")
    return None


def resume_mismatches(manifest, config, num_ranks):
    """What keeps the checkpoint described by ``manifest`` from continuing a run
    of ``config`` on ``num_ranks`` ranks; empty when it fits."""
    differs = config_differences(manifest["config"], config)
    if manifest["num_ranks"] != num_ranks:
        reason = resize_refusal(manifest, config)
        if reason:
            differs = [f"number of ranks ({manifest['num_ranks']} saved, {num_ranks} now): {reason}"] + differs
    return differs

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
})


def config_differences(saved, current):
    """Keys (other than the resumable ones) whose values differ, sorted."""
    keys = (set(saved) | set(current)) - RESUMABLE_KEYS
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def resume_mismatches(manifest, config, num_ranks):
    """What keeps the checkpoint described by ``manifest`` from continuing a run
    of ``config`` on ``num_ranks`` ranks; empty when it fits."""
    differs = config_differences(manifest["config"], config)
    if manifest["num_ranks"] != num_ranks:
        differs = [f"number of ranks ({manifest['num_ranks']} saved, {num_ranks} now)"] + differs
    return differs

"""train.py's command line: argparse + YAML config, strategies from the registry.

Bad input gets one line on rank 0 and exit status 2 on every rank, before
Horovod starts wherever possible (so no rank waits in a collective for a
rank that has already left); see hvd_easgd.errors.
"""
import argparse
import dataclasses
import errno
import inspect
import json
import os
import sys
import warnings

import yaml

from .. import _compat, checkpoint, validation
from ..choosing import auto_strategy
from . import data
from .config import (BALANCE_MODES, COSINE_IMAGE_SETS, DEFAULT_BALANCE, DEFAULT_BATCH_SIZE, DEFAULT_MODEL,
                     DEFAULT_OPTIMIZER, TEXT_LR_SCHEDULE, TEXT_MODEL, TEXT_OPTIMIZER, TEXT_POWERSGD_RANK,
                     VARIABLE_SIZE_BATCH_SIZE, VARIABLE_SIZE_MODEL, TrainConfig)
from ..callbacks import NonFiniteTrainingError
from ..comm import RanksDisagreeError
from ..comm.compression import COMPRESSIONS, POWERSGD_DEFAULT_RANK, TOPK_BITS
from .config_compare import CHANGED_DEFAULTS
from .errors import EXIT_FAILURE, UsageError, exit_with_rank_error, exit_with_usage_error
from .lr_scaling import DEFAULT_ADAM_LR, DEFAULT_EPOCHS, DEFAULT_LR, DEFAULT_TEXT_EPOCHS, MIN_UPDATES, auto_scales, \
    lr_factor, rule_help
from .models import MODELS
from ..checkpoint.preemption import EXIT_FORCED, EXIT_PREEMPTED, SIGNALS, TrainingPreempted
from ..startup.runtime import COLLECTIVES, check_collectives
from ..choosing.auto_strategy import AUTO
from ..strategies import GradientAccumulation, registry, unequal_shares_refusal
from .trainer import train

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")
LR_SCHEDULES = ("constant", "cosine")


class _RankZeroParser(argparse.ArgumentParser):
    """Prints help and errors on rank 0 only; every rank exits alike."""

    def _print_message(self, message, file=None):
        if message and _compat.launcher_rank() == 0:
            (file or sys.stdout).write(message)

    def error(self, message):
        raise UsageError(message)


class _AppendToTuple(argparse.Action):
    """``action="append"`` onto a tuple: the option's one default (``TrainConfig``'s) is immutable."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(getattr(namespace, self.dest) or ()) + (values,))


# --- the parser ---------------------------------------------------------------------
def _strategy_classes():
    return {name: registry.get(name) for name in registry.available()}


def build_parser():
    strategies = registry.available()
    parser = _RankZeroParser(
        prog="train.py",
        description="Data-parallel training with a pluggable sync strategy over Horovod ring-allreduce. "
                    "Launch with `horovodrun -np N python train.py ...` or `srun --mpi=pmix python train.py ...`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE.yaml", help="options from a YAML file; flags override it")
    parser.add_argument("--plugin", metavar="MODULE", action=_AppendToTuple,
                        help="import MODULE (found on PYTHONPATH) first, on every rank; importing it registers its "
                             "strategies (hvd_easgd.registry.register). Repeatable or comma-separated; saved in the "
                             "run's config, so --resume imports it again")
    parser.add_argument("--strategy", choices=sorted(strategies) + [AUTO],
                        help="; ".join(f"{n}: {d}" for n, d in sorted(strategies.items()))
                        + f"; {AUTO}: chosen at start-up from this job's own compute and links (docs/auto.md)")
    parser.add_argument("--auto-utilisation", type=float, metavar="U",
                        help="--strategy auto: the compute utilisation (compute / step) to reach; the most "
                             "synchronous configuration predicted to reach it is chosen")
    # The choice --strategy auto made, as config.yaml keeps it: a resume passes it back, so the run trains
    # the same strategy without measuring again. Not for the command line.
    parser.add_argument("--auto-choice", type=json.loads, help=argparse.SUPPRESS)
    group = parser.add_argument_group(
        "strategy options", "each applies to the strategies named in brackets; --strategy hierarchical also "
        "takes the options of its --inter strategy")
    for flag, owners in _strategy_flags().items():
        opt = next(iter(owners.values()))
        helps = {o.help for o in owners.values()}
        text = opt.help if len(helps) == 1 else "; ".join(f"{n}: {o.help}" for n, o in owners.items())
        text = f"{text} [--strategy {', '.join(owners)}]"
        if opt.switch:
            group.add_argument(flag, dest=_flag_dest(flag), action="store_const", const=opt.switch_value,
                               help=text)
        else:  # not given: None (argparse's default), and the strategy's own default applies
            choices = registry.choices(opt)
            group.add_argument(flag, dest=_flag_dest(flag), type=opt.type, choices=choices,
                               metavar=None if choices else flag[2:].upper().replace("-", "_"), help=text)
    acc = parser.add_argument_group("gradient accumulation (composes with any --strategy)")
    acc.add_argument("--accumulate", type=int, metavar="K", help="micro-batches per optimizer update")
    acc.add_argument("--accumulate-reduction", choices=("mean", "sum"),
                     help="apply the mean (as Keras and optax do) or the sum of the accumulated gradients")

    packed = parser.add_argument_group(
        "compression (of what the strategy sends: gradients, elastic differences, weight differences, "
        "pseudo-gradients; under --strategy hierarchical, of its inter level)")
    packed.add_argument("--compression", choices=COMPRESSIONS,
                        help="none: fp32; fp16, bf16: 2 bytes an element; int8, int4: block-scaled (a float32 scale "
                             "per 256 elements), with error feedback; powersgd: rank-R factors, --strategy sync only; "
                             "topk: each chunk's largest elements at --bits, with error feedback, --strategy diloco "
                             "and easgd only. --fp16-allreduce is --compression fp16")
    packed.add_argument("--powersgd-rank", type=int, metavar="R",
                        help=f"the rank of --compression powersgd's factors; not given: {POWERSGD_DEFAULT_RANK}, or "
                             f"{TEXT_POWERSGD_RANK} for the {TEXT_MODEL}")
    packed.add_argument("--density", type=float, metavar="D",
                        help="the share of each chunk of 4095 elements --compression topk sends, 0 < D <= 1 "
                             "(default 1/64)")
    packed.add_argument("--bits", type=int, choices=TOPK_BITS,
                        help="the bits of each value --compression topk sends (default 2)")

    train = parser.add_argument_group("model, data and optimizer")
    train.add_argument("--model", help=f"{' | '.join(MODELS)}; not given: {DEFAULT_MODEL}, "
                                       f"{VARIABLE_SIZE_MODEL} for images:DIR, {TEXT_MODEL} for text")
    train.add_argument("--data", help=f"{data.SPEC_HELP} (python_docs and text:PATH are text, read as bytes; "
                                      "docs/train.md)")
    train.add_argument("--train-fraction", type=float, metavar="F",
                       help="train on this share of the training split, its samples spread evenly through it "
                            "(default 1; the held-out split stays whole)")
    train.add_argument("--image-shape", help="H,W,C of --data synthetic")
    train.add_argument("--num-classes", type=int, help="classes of --data synthetic")
    train.add_argument("--optimizer", choices=OPTIMIZERS,
                       help=f"not given: {DEFAULT_OPTIMIZER}, or {TEXT_OPTIMIZER} for the {TEXT_MODEL}")
    train.add_argument("--momentum", type=float, help="for momentum and nesterov")
    train.add_argument("--lr", type=float,
                       help=f"learning rate of the inner optimizer (default {DEFAULT_LR}, scaled by --scale-lr auto; "
                            f"adam: {DEFAULT_ADAM_LR}); with --lr-schedule cosine, its peak")
    train.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                       help=f"cosine: a linear warm-up from 0 over --lr-warmup-updates, then a cosine decay to "
                            f"--lr-floor x the peak at the last update; not given: constant, or cosine for the "
                            f"{TEXT_MODEL} and --data {' | '.join(COSINE_IMAGE_SETS)}")
    train.add_argument("--lr-warmup-updates", type=int, metavar="N",
                       help="the cosine schedule's warm-up (default: 5%% of the run's updates, at most 200)")
    train.add_argument("--lr-floor", type=float, help="the cosine schedule's last rate, as a fraction of its peak")
    train.add_argument("--batch-size", type=int,
                       help=f"per rank, per micro-batch with --accumulate (default {DEFAULT_BATCH_SIZE}; "
                            f"images:DIR takes {VARIABLE_SIZE_BATCH_SIZE})")
    train.add_argument("--epochs", type=int,
                       help=f"default {DEFAULT_EPOCHS}, or more to make at least {MIN_UPDATES} optimizer updates "
                            f"when the ranks (and --accumulate) leave few in an epoch; text: {DEFAULT_TEXT_EPOCHS}")
    train.add_argument("--seed", type=int, help="weights and data order (not the train/test split)")
    train.add_argument("--scale-lr", action=argparse.BooleanOptionalAction,
                       help="multiply --lr by a factor that grows with the ranks and --accumulate K; auto: when "
                            "--lr is not given, for strategies with a rule for the optimizer (SGD's family, or "
                            f"Adam's own; --no-scale-lr: never). {rule_help(_strategy_classes())}")
    train.add_argument("--lr-warmup-epochs", type=float,
                       help="with the scaled rate: ramp linearly from --lr to it over these epochs")
    train.add_argument("--threads-per-rank", type=int,
                       help="TF threads per rank (default: SLURM_CPUS_PER_TASK, else cores / local ranks)")
    train.add_argument("--collectives", choices=COLLECTIVES,
                       help="how every collective travels: through Horovod, or straight over MPI through "
                            "hvd_easgd's own ops (mpi-direct: MPI launches on CPU only, not horovodrun --gloo). "
                            "auto: mpi-direct under an MPI launch on CPU with its ops built, else horovod; "
                            "rank 0 says which and why at start-up")
    train.add_argument("--balance", choices=BALANCE_MODES,
                       help="ranks of unequal speed: speed: each rank's share of the global batch in proportion "
                            "to its speed, measured at start-up, and each rank's contribution weighted by its "
                            "share (sync, periodic, diloco); off: equal shares (default %s)" % DEFAULT_BALANCE)
    # The shares --balance speed measured, as config.yaml keeps them: a resume at the same number of ranks
    # passes them back, so the run takes the same samples without measuring again. Not for the command line.
    train.add_argument("--sample-shares", type=json.loads, help=argparse.SUPPRESS)
    train.add_argument("--max-bad-steps", type=int,
                       help="abort after this many consecutive steps with NaN/Inf updates")

    lm = parser.add_argument_group("language model (--model transformer on text)")
    lm.add_argument("--context", type=int, metavar="T", help="tokens (bytes) a sample holds")
    lm.add_argument("--layers", type=int, metavar="L", help="transformer blocks")
    lm.add_argument("--width", type=int, metavar="D", help="the residual stream's width (a multiple of --heads)")
    lm.add_argument("--heads", type=int, metavar="H", help="attention heads")

    run = parser.add_argument_group("run directory")
    run.add_argument("--run-dir", help="default runs/<timestamp>-<strategy>")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue from the last checkpoint there")
    run.add_argument("--checkpoint-every", type=int, metavar="N", help="epochs between checkpoints")
    run.add_argument("--checkpoint-every-steps", type=int, metavar="N",
                     help="also checkpoint every N micro-batches (0: off); resumes at that exact micro-batch")
    run.add_argument("--checkpoint-every-minutes", type=float, metavar="M",
                     help="also checkpoint every M minutes by rank 0's clock, agreed every --agree-every "
                          "micro-batches (0: off)")
    run.add_argument("--checkpoint-on-signal", metavar="SIGNALS",
                     help="TERM, USR1, ... (comma-separated) or none: on any rank, every rank checkpoints at "
                          f"one agreed micro-batch and exits with status {EXIT_PREEMPTED}; a second signal, or "
                          f"--stop-grace-seconds without a finished checkpoint, exits at once with {EXIT_FORCED}")
    run.add_argument("--agree-every", type=int, metavar="N",
                     help="micro-batches between the ranks' agreements on signals and the minutes trigger")
    run.add_argument("--stop-grace-seconds", type=float, metavar="S",
                     help="after a signal, exit at once if still running S seconds later")
    run.add_argument("--auto-resume", action="store_true",
                     help="with --run-dir: resume if it holds a complete checkpoint, else start fresh")
    run.add_argument("--keep-checkpoints", type=int, metavar="K",
                     help="keep the newest K intact checkpoints (damaged ones do not count); a save that fails "
                          "(a full or read-only disk) is reported in one line, training goes on and the next "
                          "checkpoint tries again")
    run.add_argument("--elastic", action=argparse.BooleanOptionalAction,
                     help="under horovodrun's elastic mode over Gloo (--min-np, --host-discovery-script): survive "
                          "a dead rank, continuing at the smaller size from the last in-memory commit, and grow back "
                          "when hosts return (docs/elastic.md); a --resume keeps the saved run's choice unless "
                          "--no-elastic")
    run.add_argument("--elastic-commit-every", type=int, metavar="N",
                     help="with --elastic: micro-batches between in-memory commits, rounded up to the strategy's "
                          "synchronisation period (default 50; 0: epoch ends only)")
    run.add_argument("--eval-every", type=int, metavar="N", help="epochs between test evaluations")
    run.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                     help="do not write tensorboard/ logs")
    run.add_argument("--step-timeline", action="store_true",
                     help="write timeline.json in the run directory (rank 0): each background collective's "
                          "submit/start/end and each train step's begin/end wall times, and the share of "
                          "collective time during which a step was computing (overlap_share)")
    run.add_argument("--verbose", type=int, choices=(0, 1, 2),
                     help="Keras verbosity on rank 0 (default: progress bar on a terminal, a line per epoch otherwise)")
    # Every default is TrainConfig's (one copy): argparse shows it in --help and parses to it.
    parser.set_defaults(**TrainConfig.option_defaults())
    return parser


def _strategy_flags():
    """``{flag: {strategy name: CliOption}}``. A flag that several strategies
    declare (``--tau``) is ONE flag of the command line, and must mean the same
    kind of value for each of them."""
    table = {}
    for name, cls in sorted(_strategy_classes().items()):
        for opt in cls.cli_options:
            owners = table.setdefault(opt.flag, {})
            first = next(iter(owners.values()), opt)
            if (first.type, first.choices, first.switch, first.switch_value) != (
                    opt.type, opt.choices, opt.switch, opt.switch_value):
                raise TypeError(f"strategies declare {opt.flag} with different kinds of value; one flag, one kind")
            owners[name] = opt
    return table


def _option_key(flag):
    """A strategy option's name in a config (config.yaml, ``TrainConfig.strategy_options``): ``--tau`` is ``tau``."""
    return flag[2:].replace("-", "_")


def _flag_dest(flag):
    # "__" marks a strategy option's parser dest (see _config_to_defaults and _given_strategy_options).
    return "strategy__" + _option_key(flag)


def _given_strategy_options(args):
    """``{option key: value}`` of the strategy options the parsed command line gives (not None)."""
    given = {_option_key(flag): getattr(args, _flag_dest(flag)) for flag in _strategy_flags()}
    return {key: value for key, value in given.items() if value is not None}


def _implied_options(strategy, options, saved):
    """What the strategy (and the one it contains) imply beside the given ``options``
    (``SyncStrategy.implied_options``): config.yaml names them. A resumed run whose saved
    config lacks one ran before its default changed, at the value ``CHANGED_DEFAULTS`` names."""
    if strategy == AUTO:
        return {}
    cls = registry.get(strategy)
    implied = dict(cls.implied_options(options))
    delegate = _delegate(cls, options)
    if delegate is not None:
        implied.update(registry.get(delegate[1]).implied_options(options))
    if saved:
        implied = {k: CHANGED_DEFAULTS[k] if k in CHANGED_DEFAULTS and k not in saved else v
                   for k, v in implied.items()}
        # The trainer resolves a strategy's warm-up rule (it follows the run's updates) and config.yaml
        # names the value; a saved config without it ran before the rule.
        if cls.default_warmup_steps(options, 0) is not None and "warmup_steps" not in {**saved, **options}:
            implied["warmup_steps"] = CHANGED_DEFAULTS["warmup_steps"]
    return implied


def _delegate(cls, options):
    """For a strategy that contains another one chosen by name (Hierarchical's
    ``--inter``): ``(its kwarg, the chosen strategy's name)``, else None."""
    if not getattr(cls, "cli_delegate", None):
        return None
    kwarg, default = cls.cli_delegate
    flag = next(opt.flag for opt in cls.cli_options if opt.kwarg == kwarg)
    return kwarg, options.get(_option_key(flag)) or default


def _accepted_flags(strategy, options):
    """``{flag: (strategy name, CliOption)}``: the strategy options a command line
    with ``--strategy strategy`` and the strategy ``options`` may give, and to whom
    each goes. The chosen strategy's own come first; a contained strategy's
    (``--inter easgd``'s ``--tau``) fill in the rest."""
    cls = registry.get(strategy)
    accepted = {}
    delegate = _delegate(cls, options)
    if delegate is not None:
        accepted.update({opt.flag: (delegate[1], opt) for opt in registry.get(delegate[1]).cli_options})
    accepted.update({opt.flag: (strategy, opt) for opt in cls.cli_options})
    return accepted


def _load_yaml(path, parser):
    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        raise UsageError(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--config {path}: expected a mapping of option: value")
    return _config_to_defaults(loaded, parser, f"--config {path}")


def _config_to_defaults(config, parser, source):
    """Maps config keys (flag names with _ or -, strategy options by their flag) to parser dests."""
    by_flag = {}
    for action in parser._actions:
        if "__" not in action.dest:  # plain options are also known by their dest
            by_flag[action.dest] = action.dest
        for flag in action.option_strings:
            if flag.startswith("--"):
                by_flag[flag[2:].replace("-", "_")] = action.dest
    defaults = {}
    for key, value in config.items():
        norm = str(key).replace("-", "_")
        if norm not in by_flag:
            raise UsageError(f"{source}: unknown option {key!r}")
        defaults[by_flag[norm]] = value
    return defaults


def _saved_config(run_dir):
    """The config of the newest checkpoint in ``run_dir``: the one a resume continues.

    Read from its manifest, whose format is checked first: options saved under
    another format's meaning must not become this run's defaults. No shard is
    read here: the ranks verify them before loading (``checkpoint.latest``), and
    fall back to an older checkpoint of the same run, with the same options.
    """
    return checkpoint.newest_manifest(run_dir)["config"]


def _import_plugins(argv):
    """Imports the plugins of the command line, of ``--resume``'s saved config
    and of ``--config``'s file, before the parser is built: their strategies
    are then ``--strategy`` choices, their options flags, and a saved strategy
    name is valid. Returns the modules, saved first."""
    early = _RankZeroParser(add_help=False)
    for flag in ("--plugin", "--resume", "--config"):
        early.add_argument(flag, action="append" if flag == "--plugin" else "store")  # not given: None
    first, _ = early.parse_known_args(argv)
    found = []
    if first.resume:
        found.append(_saved_config(first.resume).get("plugin"))
    if first.config and os.path.isfile(first.config):
        try:
            with open(first.config) as f:
                loaded = yaml.safe_load(f)
        except yaml.YAMLError:
            loaded = None  # _load_yaml reports it
        if isinstance(loaded, dict):
            found.append(loaded.get("plugin"))
    modules = registry.plugin_modules([m for m in found if m] + (first.plugin or []))
    try:
        registry.import_plugins(modules)
    except ValueError as err:
        raise UsageError(f"--plugin: {err}") from None
    return modules


def parse_args(argv=None):
    """The job ``argv`` describes, validated and resolved as far as it can be before the ranks start.

    Options come from, last winning: their defaults (``TrainConfig``'s), a
    resumed run's saved options (``--resume``, or ``--auto-resume`` finding a
    checkpoint), the YAML ``--config`` file, and the flags.

    Args:
      argv: the arguments after ``train.py`` (default ``sys.argv[1:]``).

    Returns:
      A frozen ``TrainConfig``.

    Raises:
      UsageError: bad input, in one line.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    plugins = _import_plugins(argv)  # first: the parser offers what they register
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    defaults = {}
    saved = {}
    if first.resume:
        saved = {k: v for k, v in _saved_config(first.resume).items() if k not in ("resume", "config", "run_dir")}
        defaults.update(_config_to_defaults(saved, parser, f"--resume {first.resume}"))
    if first.config:
        defaults.update(_load_yaml(first.config, parser))
    parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    args.plugin = tuple(plugins)
    if args.auto_resume and not args.resume:
        if not args.run_dir:
            raise UsageError("--auto-resume needs --run-dir (the directory to resume from or start in)")
        if checkpoint.complete_checkpoints(args.run_dir):
            return parse_args(argv + ["--resume", args.run_dir])  # its saved config becomes the defaults
    if args.resume:
        args.run_dir = args.resume
    options = _given_strategy_options(args)
    lr_given = args.lr is not None
    _validate(args, options)
    options = {**options, **_implied_options(args.strategy, options, saved)}
    config = TrainConfig(**{name: getattr(args, name) for name in TrainConfig.option_defaults()},
                         strategy_options=options)
    if config.balance == "speed" and config.strategy != AUTO:
        refusal = unequal_shares_refusal(make_strategy(config))
        if refusal:
            raise UsageError(f"--balance speed: {refusal}")
    return _resolve_scale_lr(config, lr_given)


def _validate(args, options):
    """Checks argparse's namespace and resolves what takes effect in place (the
    namespace is this module's own, before the frozen config is made)."""
    variable_size = args.data.startswith("images:")
    _resolve_model(args, variable_size)
    if args.batch_size is None:
        args.batch_size = VARIABLE_SIZE_BATCH_SIZE if variable_size else DEFAULT_BATCH_SIZE
    elif variable_size and args.batch_size != VARIABLE_SIZE_BATCH_SIZE:
        raise UsageError("images of different sizes cannot be stacked into a batch: use --batch-size 1 "
                         "with --accumulate K (one image per micro-batch)")
    _resolve_lr(args)
    positive = {"--batch-size": args.batch_size, "--lr": args.lr,
                "--accumulate": args.accumulate, "--num-classes": args.num_classes,
                "--eval-every": args.eval_every, "--max-bad-steps": args.max_bad_steps,
                "--powersgd-rank": args.powersgd_rank, "--context": args.context, "--layers": args.layers,
                "--width": args.width, "--heads": args.heads}
    if args.epochs is not None:  # None: the default, resolved once the ranks are known
        positive["--epochs"] = args.epochs
    for flag, value in positive.items():
        if value is None or not value > 0:
            raise UsageError(f"{flag} must be > 0. Received: {flag}={value}")
    if not 0 <= args.momentum < 1:
        raise UsageError(f"--momentum must satisfy 0 <= momentum < 1. Received: --momentum={args.momentum}")
    if args.checkpoint_every < 0 or args.keep_checkpoints < 1:
        raise UsageError("--checkpoint-every must be >= 0 and --keep-checkpoints >= 1")
    if args.checkpoint_every_steps < 0 or args.checkpoint_every_minutes < 0:
        raise UsageError("--checkpoint-every-steps and --checkpoint-every-minutes must be >= 0")
    if args.elastic and not args.run_dir:
        raise UsageError("`--elastic` needs --run-dir (a replacement rank finds the run by its directory's name). "
                         "Received: --elastic without --run-dir")
    if args.strategy == AUTO and args.balance == "speed":
        raise UsageError("--balance speed with --strategy auto: auto prices ranks of equal speed and may choose "
                         "Hierarchical, which takes equal shares; give the strategy (sync, periodic or diloco)")
    if args.elastic and args.balance == "speed":
        raise UsageError("--balance speed measures the ranks at start-up, and --elastic changes them during the "
                         "run; choose one")
    if args.balance != "speed":
        # Shares are --balance speed's: a run resumed with --balance off trains equal shares from its next
        # step on (as a resume at another number of ranks changes them), so the saved ones are dropped.
        args.sample_shares = None
    if args.elastic_commit_every is not None and args.elastic_commit_every < 0:
        raise UsageError("--elastic-commit-every must be >= 0. "
                         f"Received: --elastic-commit-every={args.elastic_commit_every}")
    if args.agree_every < 1 or args.stop_grace_seconds <= 0:
        raise UsageError("--agree-every must be >= 1 and --stop-grace-seconds > 0")
    names = [] if args.checkpoint_on_signal.lower() == "none" else args.checkpoint_on_signal.upper().split(",")
    names = [n[3:] if n.startswith("SIG") else n for n in names]
    if not set(names) <= set(SIGNALS):
        raise UsageError(f"--checkpoint-on-signal must be none or names among {','.join(sorted(SIGNALS))}. "
                         f"Received: --checkpoint-on-signal={args.checkpoint_on_signal}")
    args.checkpoint_on_signal = ",".join(names) or "none"
    if not 0 < args.density <= 1:
        raise UsageError(f"--density must satisfy 0 < D <= 1. Received: --density={args.density}")
    if not 0 < args.train_fraction <= 1:
        raise UsageError(f"--train-fraction must satisfy 0 < F <= 1. Received: --train-fraction={args.train_fraction}")
    if args.lr_warmup_epochs < 0:
        raise UsageError(f"--lr-warmup-epochs must be >= 0. Received: --lr-warmup-epochs={args.lr_warmup_epochs}")
    _validate_schedule(args)
    try:  # before anything starts, so every rank leaves alike
        check_collectives(args.collectives)
    except ValueError as err:  # the runtime's one message, as this command line's one line
        raise UsageError(str(err)) from None
    if args.threads_per_rank is not None and args.threads_per_rank < 1:
        raise UsageError(f"--threads-per-rank must be >= 1. Received: {args.threads_per_rank}")
    try:
        shape = tuple(int(s) for s in str(args.image_shape).split(","))
        assert len(shape) == 3 and min(shape) > 0
    except (ValueError, AssertionError):
        raise UsageError(f"--image-shape must be H,W,C of positive integers. Received: {args.image_shape!r}") from None
    args.image_shape = ",".join(map(str, shape))
    if args.strategy == AUTO:
        _validate_auto(args, options)
        return
    if args.auto_utilisation != auto_strategy.DEFAULT_UTILISATION or args.auto_choice is not None:
        raise UsageError(f"--auto-utilisation is an option of --strategy auto, not --strategy {args.strategy}")
    # A strategy option given to a strategy that does not take it.
    accepted = _accepted_flags(args.strategy, options)
    delegate = _delegate(registry.get(args.strategy), options)
    chosen = f"--strategy {args.strategy}" + (f" --{delegate[0]} {delegate[1]}" if delegate else "")
    for flag, owners in _strategy_flags().items():
        if _option_key(flag) in options and flag not in accepted:
            raise UsageError(f"{flag} is an option of --strategy {' or '.join(owners)}, not {chosen}")


def _resolve_model(args, variable_size):
    """``--model``, ``--optimizer`` and ``--powersgd-rank`` as they take effect (the data's model; Adam
    and rank 16 for the transformer), refusing a model that cannot read the data."""
    text = data.is_text(args.data)
    if args.model is None:
        args.model = TEXT_MODEL if text else VARIABLE_SIZE_MODEL if variable_size else DEFAULT_MODEL
    if args.model not in MODELS:
        raise UsageError(f"--model must be one of {sorted(MODELS)}. Received: {args.model!r}")
    if text != (args.model == TEXT_MODEL):
        raise UsageError(f"--model {args.model} cannot read --data {args.data}: text takes --model {TEXT_MODEL}, "
                         f"and --model {TEXT_MODEL} takes text (python_docs or text:PATH)")
    if args.model == TEXT_MODEL and args.width and args.heads and args.width % args.heads:
        raise UsageError(f"--width must be a multiple of --heads. Received: --width {args.width} --heads {args.heads}")
    if args.optimizer is None:
        args.optimizer = TEXT_OPTIMIZER if args.model == TEXT_MODEL else DEFAULT_OPTIMIZER
    if args.powersgd_rank is None:
        args.powersgd_rank = TEXT_POWERSGD_RANK if args.model == TEXT_MODEL else POWERSGD_DEFAULT_RANK


def _validate_schedule(args):
    """``--lr-schedule`` as it takes effect (cosine for the transformer and ``COSINE_IMAGE_SETS``), and its
    options checked."""
    if args.lr_schedule is None:
        cosine = args.model == TEXT_MODEL or args.data.partition(":")[0] in COSINE_IMAGE_SETS
        args.lr_schedule = TEXT_LR_SCHEDULE if cosine else "constant"
    if not 0 <= args.lr_floor <= 1:
        raise UsageError(f"--lr-floor must satisfy 0 <= floor <= 1. Received: --lr-floor={args.lr_floor}")
    if args.lr_warmup_updates is not None and args.lr_warmup_updates < 0:
        raise UsageError(f"--lr-warmup-updates must be >= 0. Received: --lr-warmup-updates={args.lr_warmup_updates}")
    if args.lr_schedule == "cosine" and args.lr_warmup_epochs:
        raise UsageError("--lr-warmup-epochs is the constant schedule's ramp to a scaled rate; --lr-schedule cosine "
                         "warms up over --lr-warmup-updates. Received: --lr-schedule cosine --lr-warmup-epochs "
                         f"{args.lr_warmup_epochs}")
    if args.lr_schedule == "constant" and args.lr_warmup_updates is not None:
        raise UsageError("--lr-warmup-updates goes with --lr-schedule cosine. "
                         f"Received: --lr-schedule constant --lr-warmup-updates {args.lr_warmup_updates}")


def _resolve_lr(args):
    """``--lr`` as it takes effect: not given, ``DEFAULT_LR`` (Adam's: ``DEFAULT_ADAM_LR``).
    ``--epochs`` not given stays None here: its default needs the number of ranks (``trainer``)."""
    if args.scale_lr not in (True, False, "auto"):
        raise UsageError(f"--scale-lr must be auto, true or false. Received: scale_lr={args.scale_lr!r}")
    if args.lr is None:
        args.lr = DEFAULT_ADAM_LR if args.optimizer == "adam" else DEFAULT_LR


def _validate_auto(args, options):
    """``--strategy auto`` chooses the strategy, its options and the format itself: none of them is given."""
    given = [f"--{key.replace('_', '-')}" for key in options] + (
        [f"--compression {args.compression}"] if args.compression != "none" else [])
    if given:
        raise UsageError(f"--strategy auto chooses the strategy's options and format itself; give a strategy "
                         f"instead to set them. Received: {' '.join(given)}")
    if args.accumulate != 1 or args.elastic:
        raise UsageError("--strategy auto does not choose under --accumulate or --elastic; give the strategy. "
                         f"Received: --accumulate {args.accumulate}" + (" --elastic" if args.elastic else ""))
    if not 0 < args.auto_utilisation <= 1:
        raise UsageError(f"--auto-utilisation must satisfy 0 < U <= 1. Received: --auto-utilisation="
                         f"{args.auto_utilisation}")


def _resolve_scale_lr(config, lr_given):
    """``config`` with ``--scale-lr auto`` resolved to True or False
    (``lr_scaling.auto_scales``), so config.yaml and a resume see the choice
    made. Asked of the strategy the run builds (``make_strategy``), as its rule
    may need its options (Hierarchical's n and inter strategy); a strategy
    without a measured rule is refused under ``--scale-lr`` here, before
    Horovod starts."""
    scale_lr = config.scale_lr
    if config.strategy == AUTO and config.auto_choice is None:
        # The rule is the chosen strategy's: "auto" stays until the choice (trainer), and means that
        # --lr was not given (with --lr, the rule keeps it as given).
        if scale_lr is True:
            raise UsageError("--scale-lr with --strategy auto: the rule is the chosen strategy's; leave "
                             "--scale-lr auto (the default) or give the strategy")
        return dataclasses.replace(config, scale_lr=False if lr_given else scale_lr)
    if scale_lr is not False:
        strategy = make_strategy(config)
        if scale_lr == "auto":
            scale_lr = auto_scales(strategy, config.optimizer, lr_given)
        else:
            try:  # at one rank: the number of ranks is not known yet
                lr_factor(strategy, 1, optimizer=config.optimizer)
            except ValueError as err:
                raise UsageError(f"--scale-lr: {err}") from None
    if config.lr_warmup_epochs and not scale_lr:
        raise UsageError("--lr-warmup-epochs goes with a scaled rate (--scale-lr, or --scale-lr auto without --lr), "
                         f"and this run keeps --lr {config.lr}. Received: --lr-warmup-epochs={config.lr_warmup_epochs}")
    return dataclasses.replace(config, scale_lr=scale_lr)


def strategy_kwargs(config, name=None):
    """The keyword arguments ``config`` (a ``TrainConfig``) gives strategy ``name`` (default: its ``strategy``)."""
    name = name or config.strategy
    options = config.strategy_options
    return {opt.kwarg: options[_option_key(flag)]
            for flag, (owner, opt) in _accepted_flags(config.strategy, options).items()
            if owner == name and _option_key(flag) in options}


def make_strategy(config):
    """The sync strategy ``config`` (a ``TrainConfig``) describes, not yet bound to the ranks; for
    ``--strategy auto``, the one chosen (``config.auto_choice``), None before the choice."""
    if config.strategy == AUTO:
        return None if config.auto_choice is None else auto_strategy.strategy_of(config.auto_choice)
    try:
        kwargs = strategy_kwargs(config)
        delegate = _delegate(registry.get(config.strategy), config.strategy_options)
        if delegate is not None:  # the contained strategy is built first, from its own options
            kwarg, name = delegate  # and it is what --compression applies to (the inter level)
            kwargs[kwarg] = registry.create(name, **_with_compression(config, name, strategy_kwargs(config, name)))
        else:
            kwargs = _with_compression(config, config.strategy, kwargs)
        strategy = registry.create(config.strategy, **kwargs)
        if config.accumulate > 1:
            strategy = GradientAccumulation(config.accumulate, average=config.accumulate_reduction == "mean",
                                            strategy=strategy)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return strategy


def _with_compression(config, name, kwargs):
    """``kwargs`` for strategy ``name`` with ``--compression`` in them (``--fp16-allreduce``
    is its alias); a strategy that takes no ``compression`` is refused unless it is none."""
    chosen = config.compression
    alias = kwargs.get("compression")  # --fp16-allreduce
    if alias is not None and chosen not in ("none", alias):
        raise UsageError(f"--fp16-allreduce is --compression fp16; give one of them. "
                         f"Received: --compression {chosen} --fp16-allreduce")
    chosen = alias or chosen
    if chosen == "none":
        return kwargs
    parameters = inspect.signature(registry.get(name)).parameters
    if "compression" not in parameters:
        raise UsageError(f"--compression must be none for --strategy {name}: it takes no compression. "
                         f"Received: --compression {chosen}")
    # The strategy refuses a format that does not apply to it (powersgd outside sync).
    extra = {"powersgd_rank": config.powersgd_rank} if chosen == "powersgd" and "powersgd_rank" in parameters else {}
    if chosen == "topk":
        chosen = {"name": "topk", "density": config.density, "bits": config.bits}
    return {**kwargs, "compression": chosen, **extra}


def effective_config(config):
    """Every option as it takes effect, strategy options under their flag names: ``config.as_dict()``."""
    return config.as_dict()


# --- entry point -------------------------------------------------------------------------
_PYTHON_FORMATWARNING = warnings.formatwarning


def format_warning(message, category, filename, lineno, line=None):
    """One console line for a warning about the run's arguments (rank 0's alone, see
    ``validation.ConfigurationWarning``): the line of library source Python would print under it says
    nothing to a user of train.py. Any other warning keeps Python's form, with its source."""
    if issubclass(category, validation.ConfigurationWarning):
        return f"train.py: warning: {message}\n"
    return _PYTHON_FORMATWARNING(message, category, filename, lineno, line)


def main(argv=None):
    warnings.formatwarning = format_warning
    try:
        config = parse_args(argv)
        strategy = make_strategy(config)  # bad hyperparameters fail before Horovod starts
        try:
            dataset = data.load(config.data, tuple(int(s) for s in config.image_shape.split(",")),
                                config.num_classes, seed=config.seed, context=config.context)
            if config.train_fraction < 1:
                dataset = data.train_slice(dataset, config.train_fraction)
        except data.DataError as err:
            raise UsageError(str(err)) from None
        train(config, dataset, strategy)
    except (UsageError, RanksDisagreeError, checkpoint.CheckpointError, _compat.StackMismatchError) as err:
        exit_with_usage_error(err)
    except TrainingPreempted as err:
        print(f"train.py: {err}; exit status {EXIT_PREEMPTED}", file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    except NonFiniteTrainingError as err:
        exit_with_rank_error(err, EXIT_FAILURE)
    except OSError as err:
        if err.errno not in DISK_FULL_OR_READ_ONLY:
            raise
        # Checkpoints handle this themselves (the run goes on); what is left is a file
        # only rank 0 writes (model.keras, metrics.json): this rank says which, once.
        exit_with_rank_error(f"cannot write {err.filename or 'a file'}: [Errno {err.errno}] {err.strerror}; "
                             "the newest intact checkpoint stays usable", EXIT_FAILURE)
    except Exception as err:  # a collective failed because another rank died or stalled
        if not _is_collective_failure(err):
            raise
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        exit_with_rank_error("a collective failed, most likely because another rank died or stopped "
                             f"answering: {first_line[:300]}", EXIT_FAILURE)


DISK_FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _is_collective_failure(err):
    text = f"{type(err).__name__} {err}"
    return any(marker in text for marker in ("Horovod", "horovod", "Gloo", "gloo", "MPI_"))

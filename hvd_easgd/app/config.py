"""One training job's options: the frozen ``TrainConfig`` that ``cli`` builds and ``trainer`` runs.

Each option has one default, written once: here, as the field's default.
``cli.build_parser`` gives argparse these defaults (``option_defaults``);
where a library class already has a default for the same thing (the
callbacks' checkpoint period, the stop grace period, ...), the field takes
that class's, so no value exists twice. A default of ``None`` means "not
given": the value is resolved later, once, by the code that knows it (``--lr``
by ``cli``, ``--epochs`` by ``trainer`` once the number of ranks is known,
``--threads-per-rank`` by ``runtime``).

Values resolved after the config is built come back as a new config
(``dataclasses.replace``); nothing mutates one.
"""
import copy
import dataclasses
import inspect
import types
from typing import Mapping, Optional, Union

from ..checkpoint import preemption
from ..startup import runtime
from ..choosing.auto_strategy import DEFAULT_UTILISATION
from ..callbacks import AbortOnNonFinite, PeriodicCheckpoint
from ..comm.compression import TOPK_DEFAULT_BITS, TOPK_DEFAULT_DENSITY
from .data import DEFAULT_CONTEXT, SYNTHETIC_IMAGE_SHAPE, SYNTHETIC_NUM_CLASSES
from .transformer import DEFAULT_HEADS, DEFAULT_LAYERS, DEFAULT_WIDTH

# The per-rank batch when --batch-size is not given, and for images of different sizes (they cannot be stacked).
DEFAULT_BATCH_SIZE = 32
VARIABLE_SIZE_BATCH_SIZE = 1
# The model when --model is not given: cnn, or fcn for images:DIR (any image size), or
# transformer for text.
DEFAULT_MODEL = "cnn"
VARIABLE_SIZE_MODEL = "fcn"
TEXT_MODEL = "transformer"
# The optimizer when --optimizer is not given: momentum SGD, and Adam for the transformer,
# as language models are trained (GPT-2, nanoGPT, DiLoCo's inner optimizer).
DEFAULT_OPTIMIZER = "momentum"
# --balance: equal shares of the global batch unless asked (docs/strategies.md says when to ask).
BALANCE_MODES = ("off", "speed")
DEFAULT_BALANCE = "off"
TEXT_OPTIMIZER = "adam"
# --lr-schedule when not given: constant, and for the transformer a linear warm-up over
# DEFAULT_WARMUP_SHARE of the updates (at most MAX_DEFAULT_WARMUP_UPDATES) then a cosine
# decay to DEFAULT_LR_FLOOR of the peak at the last update.
TEXT_LR_SCHEDULE = "cosine"
# --powersgd-rank when not given: the library's (the PowerSGD paper's 4), and 16 for the transformer.
# At train.py's width of 64, rank 4 ends 8.7 % and rank 8 2 % behind SyncAverage's validation loss at
# the language model's budget, and a start sent exact (a tenth of the updates) does not close rank 4's
# gap: what the factors leave out of a 64-wide gradient is the loss (docs/language-model.md, "Where a
# goal is missed"). Rank 16 keeps it; the CNN keeps its accuracy at 4 (docs/fashion-mnist.md).
TEXT_POWERSGD_RANK = 16
# The named image sets trained with the cosine schedule when --lr-schedule is not given: at a
# constant rate the CNN's last-epoch accuracy on Fashion-MNIST still moves by tenths of a point
# from epoch to epoch and ends lower at 2 and 4 ranks, at 4 ranks only just above 0.90, with
# PowerSGD under 0.90 at 2 (docs/fashion-mnist.md has the runs). The smoke sets (digits,
# synthetic, teacher) keep the constant rate their tests and committed evidence were made at; a
# user's own images ask with --lr-schedule cosine.
COSINE_IMAGE_SETS = ("fashion_mnist",)
DEFAULT_WARMUP_SHARE = 0.05
MAX_DEFAULT_WARMUP_UPDATES = 200


def _default_of(function, parameter):
    """The default that ``function`` gives ``parameter``: the option takes the library's."""
    return inspect.signature(function).parameters[parameter].default


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every option of a training job, one field per ``train.py`` flag (its dest).

    Built by ``cli.parse_args`` from the validated command line, YAML
    ``--config`` and a resumed run's saved options. Fields that ``cli``
    resolves (``lr``, ``scale_lr``, ``batch_size``, ``model``) hold the value
    that takes effect; ``epochs`` is ``None`` until ``trainer`` resolves it.

    ``strategy_options`` maps the strategy options given (``--tau 4`` as
    ``{"tau": 4}``: the flag without dashes) to their values; each belongs to
    ``strategy`` or to the strategy it contains (Hierarchical's ``--inter``).
    ``as_dict()`` is the effective config saved with the run.
    """

    config: Optional[str] = None
    # The modules --plugin imported (saved, so a resume imports them again).
    plugin: tuple = ()
    strategy: str = "sync"
    strategy_options: Mapping[str, object] = dataclasses.field(default_factory=dict)
    accumulate: int = 1
    accumulate_reduction: str = "mean"
    # What the strategy sends, job-wide (hvd_easgd.comm.compression); Hierarchical: its inter level.
    compression: str = "none"
    # None: resolved by the model (TEXT_POWERSGD_RANK for the transformer, else POWERSGD_DEFAULT_RANK).
    powersgd_rank: Optional[int] = None
    # --compression topk's: the share of each chunk sent, and the bits of a value.
    density: float = TOPK_DEFAULT_DENSITY
    bits: int = TOPK_DEFAULT_BITS
    model: Optional[str] = None
    data: str = "digits"
    # The share of the training split trained on, spread through it (data.train_slice); the test split is whole.
    train_fraction: float = 1.0
    image_shape: str = ",".join(map(str, SYNTHETIC_IMAGE_SHAPE))  # H,W,C as the flag takes it
    num_classes: int = SYNTHETIC_NUM_CLASSES
    # Text: tokens a sample holds; the transformer's size.
    context: int = DEFAULT_CONTEXT
    layers: int = DEFAULT_LAYERS
    width: int = DEFAULT_WIDTH
    heads: int = DEFAULT_HEADS
    optimizer: Optional[str] = None
    momentum: float = 0.9
    lr: Optional[float] = None
    # "constant" or "cosine" (linear warm-up, then cosine decay to lr_floor x the peak); None until
    # cli resolves it by the model. lr_warmup_updates None: resolved by trainer from the run's updates.
    lr_schedule: Optional[str] = None
    lr_warmup_updates: Optional[int] = None
    lr_floor: float = 0.1
    batch_size: Optional[int] = None
    epochs: Optional[int] = None
    seed: int = 0
    # "auto" until cli resolves it to True or False (lr_scaling.auto_scales).
    scale_lr: Union[bool, str] = "auto"
    lr_warmup_epochs: float = 0.0
    threads_per_rank: Optional[int] = None
    collectives: str = runtime.DEFAULT_COLLECTIVES
    max_bad_steps: int = _default_of(AbortOnNonFinite, "max_consecutive")
    run_dir: Optional[str] = None
    resume: Optional[str] = None
    checkpoint_every: int = _default_of(PeriodicCheckpoint, "every")
    checkpoint_every_steps: int = _default_of(PeriodicCheckpoint, "every_steps")
    checkpoint_every_minutes: float = _default_of(PeriodicCheckpoint, "every_minutes")
    checkpoint_on_signal: str = "none"
    agree_every: int = _default_of(PeriodicCheckpoint, "check_every")
    stop_grace_seconds: float = _default_of(preemption.StopRequests, "grace_seconds")
    auto_resume: bool = False
    keep_checkpoints: int = _default_of(PeriodicCheckpoint, "keep")
    # Survive a dead rank under horovodrun's elastic mode (hvd_easgd/checkpoint/elastic.py); commits every N
    # micro-batches (None: elastic.DEFAULT_COMMIT_EVERY, resolved by elastic.commit_period).
    elastic: bool = False
    elastic_commit_every: Optional[int] = None
    eval_every: int = 1
    tensorboard: bool = True
    verbose: Optional[int] = None
    # --step-timeline: write timeline.json: background collectives and train steps (comm/timeline.py).
    step_timeline: bool = False
    # --strategy auto: the compute utilisation to reach, and the choice made at start-up
    # (auto_strategy.auto's record), saved with the run so that a resume keeps it; None before it.
    auto_utilisation: float = DEFAULT_UTILISATION
    auto_choice: Optional[dict] = None
    # --balance: "speed" gives each rank a share of the global batch in proportion to its speed
    # (hvd_easgd/strategies/sample_shares.py); the shares measured at start-up, saved so that a resume keeps them.
    balance: str = DEFAULT_BALANCE
    sample_shares: Optional[list] = None

    def __post_init__(self):
        # Frozen all the way down: a copy the caller cannot change under us.
        object.__setattr__(self, "strategy_options", types.MappingProxyType(dict(self.strategy_options)))
        object.__setattr__(self, "auto_choice", copy.deepcopy(self.auto_choice))

    def as_dict(self):
        """The effective config: every option as it takes effect, strategy options
        under their flag names (``tau``), as config.yaml and the checkpoint
        manifests save it and a resume compares it (``config_compare``).

        Returns:
          A new plain ``dict``.
        """
        plain = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
                 if f.name != "strategy_options"}
        plain["plugin"] = list(self.plugin)  # YAML (safe_dump) writes lists, not tuples
        return {**plain, **self.strategy_options}

    @classmethod
    def option_defaults(cls):
        """``{field: default}`` for the options argparse parses into plain dests
        (every field except ``strategy_options``): the one copy of each default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "strategy_options"}

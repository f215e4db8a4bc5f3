"""Bootstrap recipe for the demo policy: a locally built tiny checkpoint (`race_core.tiny`) SFT'd on
scripted-expert demonstrations (`race_core.envs.expert`).

The expert data is for bootstrapping only: it makes a random-weight model able to play the
calculator so that on-policy sampling, the cover and RL have something to work on. It is never a
RACE input (RACE compresses the policy's own successful trajectories).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from race_core.tiny import DEMO, TINY, TinyConfig, ensure_checkpoint, publish_folder
from race_core.train.sft import Progress, SFTConfig, SFTReport, train_sft

BOOTSTRAP_VERSION = 2


@dataclass(frozen=True)
class BootstrapConfig:
    """The demo policy's recipe (the figures it reaches: scripts/bench_bootstrap.py).

    Alone on an idle 2-core CPU: 79.5% greedy success on 200 held-out tasks in 288 s, training 284 s
    (~0.16 s a step). By SFT seed (1 thread each, two runs side by side): 79.5% / 80.5% (1 operation
    100%, 2 operations 97%, 3 operations 43-46%); with 60% empty later turns, seeds 0/1/2: 77% /
    86% / 76%. What made the difference, from 51.5% (seed 0; seeds 1/2: 35% / 39.5%): DEMO's
    tokenizer (`TinyConfig.split_digits`, `corpus_episodes`), which makes a number the same tokens
    wherever it stands and halves an episode's length (177 -> 89 tokens at 60% empty turns), so that
    twice the steps fit the time; then 1800 steps, 100 warmup steps and Adam beta2 0.95 (taken
    together; not measured apart). Worse, measured before: lr 1e-3 4%, lr 6e-3 35.5%; digit runs
    split off with GPT-2 style words kept (26% / 32.5%: a lone space token before every number),
    one token per digit (2%), an expert calling calc once per parenthesized group (32.5%). The
    failures left are calc calls of 3-operation tasks."""

    model: TinyConfig = DEMO
    expert_tasks: int = 4000  # expert episodes (train split, seed `expert_seed`)
    expert_seed: int = 0
    difficulty: int | None = None  # None: 1-3 operations per task
    empty_reasoning_share: float = 0.3  # most turns reason, so the cover has something to decide
    reasoning_kinds: bool = False  # the expert whose reasoning can matter across turns (`KindsExpertPolicy`)
    shape: str = "random"  # task shape (`generate_tasks`): random, or two-part for the kinds expert
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(
        lr=3e-3, steps=1800, batch_size=16, warmup_steps=100, weight_decay=0.01, adam_beta2=0.95,
        max_length=512, seed=0))

    def key(self) -> str:
        fields = asdict(self)
        for name, default in (("reasoning_kinds", False), ("shape", "random")):  # keys from before them hold
            if fields[name] == default:
                del fields[name]
        payload = json.dumps({"version": BOOTSTRAP_VERSION, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# A seconds-scale preset for tests and smoke runs: the TINY model fitted to the expert's episodes of
# a handful of one-operation training tasks (`smoke_tasks`), so that on those tasks its sampled
# rollouts succeed often but not always. Not a capable policy.
SMOKE = BootstrapConfig(
    model=TINY, expert_tasks=4, expert_seed=3, difficulty=1, empty_reasoning_share=0.0,
    sft=SFTConfig(lr=1e-2, steps=70, batch_size=4, warmup_steps=5, max_length=512, seed=0, length_grouping=False),
)


# The ablation's policy (`race ablate`, issue 17): the DEMO model on the kinds expert's episodes of
# two-part tasks, where a result noted in one turn's reasoning is what a later action needs.
KINDS = replace(BootstrapConfig(), reasoning_kinds=True, shape="two-part")


def smoke_tasks(config: BootstrapConfig = SMOKE):
    """The training tasks whose expert episodes `config` was fitted to."""
    from race_core.envs.calculator import generate_tasks

    return generate_tasks(config.expert_tasks, config.expert_seed, config.difficulty)


@dataclass
class BootstrapResult:
    checkpoint: Path
    report: SFTReport | None  # None when a cached checkpoint was reused
    base_checkpoint: Path


def expert_trajectories(config: BootstrapConfig):
    from race_core.envs.expert import expert_dataset

    return expert_dataset(config.expert_tasks, config.expert_seed, config.difficulty,
                          empty_reasoning_share=config.empty_reasoning_share,
                          reasoning_kinds=config.reasoning_kinds, shape=config.shape)


def bootstrap_policy(out_dir: str | Path, config: BootstrapConfig = BootstrapConfig(),
                     cache_dir: str | Path | None = None, progress: Progress | None = None) -> BootstrapResult:
    """Build the tiny base checkpoint (cached under `cache_dir`, default next to `out_dir`), SFT it on
    expert demonstrations and save the policy to `out_dir`."""
    out_dir = Path(out_dir)
    base = ensure_checkpoint(cache_dir or out_dir.parent / "base-checkpoints", config.model)
    report = train_sft(base, None, expert_trajectories(config), config.sft, out_dir, progress)
    (out_dir / "race_bootstrap.json").write_text(json.dumps(asdict(config), sort_keys=True, indent=1, default=str))
    return BootstrapResult(checkpoint=out_dir, report=report, base_checkpoint=base)


def ensure_bootstrap(cache_dir: str | Path, config: BootstrapConfig = BootstrapConfig(),
                     progress: Progress | None = None) -> BootstrapResult:
    """The bootstrapped policy for `config`, trained once under `cache_dir/<config key>` and reused."""
    cache_dir = Path(cache_dir)
    out = cache_dir / f"bootstrap-{config.key()}"
    if (out / "race_bootstrap.json").exists():
        return BootstrapResult(checkpoint=out, report=None,
                               base_checkpoint=ensure_checkpoint(cache_dir / "base-checkpoints", config.model))
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=cache_dir))  # its own: processes may train at once
    try:
        result = bootstrap_policy(tmp, config, cache_dir / "base-checkpoints", progress)
        publish_folder(tmp, out)  # the first to finish publishes; the same seeded recipe, the same policy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return BootstrapResult(checkpoint=out, report=result.report, base_checkpoint=result.base_checkpoint)

"""Multi-turn on-policy episodes over a Sampler and an environment (docs/architecture.md §5, §6).

For K tasks × G samples, every episode's token sequence is built INCREMENTALLY: it starts as
`renderer.prompt_ids(question, [])`, each step the sampler continues the current ids, and the
wrapper/observation ids are appended after the generated ones. Past turns are never re-tokenized, so
the context the sampler saw, the sequence the RL update scores and the old log-probs agree exactly.

Each task is played in its own environment (`task.environment`, a `race_core.envs.base.Environment`:
the calculator, the people lookup, ...). The policy plays with the prompt its tokenizer carries
(`race_core.envs.agent.AgentPrompt`: a system prompt, the environment's tools, text or tool-call
actions); the episode starts from `renderer.prompt_ids(question, [], system, tools)`.

After each generation (stop token included):
  * the generated ids are kept as generated (token-out: what the policy wrote is what RL trains
    on) and parsed by decoding: the text between `<think>` and `</think>` is the reasoning; the
    action is, with text actions, the text after `\\nAction: ` (up to the end-of-turn stop), with
    tool-call actions the calls written after `</think>` in the template's format
    (`parse_tool_calls`). A generation that does not follow this format (no leading `<think>`, no
    `</think>`, no action after it, or no stop before the token limit) is *malformed*: the env
    receives an empty action, which it answers as invalid (still a turn of the budget). Each
    generated token takes the role of its last decoded character, as the renderer tags rendered
    tokens; the stop token is END;
  * then the rest of the assistant message's closing wrapper (all of it after a length cut), the
    observation (a tool result after a tool call) and, unless the episode is over, the next
    assistant opening, tokenized by `Renderer.tokenize` from the same segments `render.py` renders. The stop is an added token
    where the chat format closes messages with one, and the renderer cuts right after added
    tokens, so for well-formed turns written in the tokenizer's own tokens the rollout's ids equal
    `renderer.render_turns(question, turns)` plus the prompt's opening.

Only the env's private judge reads the task's answer; reference actions are never read here.

The policy plays through `play_episodes` (an HFSampler over an in-memory model, so the device and
dtype it was loaded with are the ones that sample): `sample_rollouts` draws one RL iteration's
rollouts (`training_tasks`), `sample_successful_trajectories` the policy's own successful episodes
(RACE's input). Rollouts travel between stages as JSON (`rollouts_to_json` / `rollouts_from_json`):
token ids, roles, masks and old log-probs exact.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from race_core.config import RLConfig
from race_core.envs import DEFAULT_ENV, get_environment
from race_core.envs.agent import TOOLS, AgentPrompt
from race_core.envs.base import Task
from race_core.envs.calculator import DEFAULT_MAX_TURNS, ENV_REVISION, ENVIRONMENT_NAME
from race_core.render import ACTION_PREFIX, CLOSE_MARKER, OPEN_MARKER, TOOLS_TEMPLATE, Renderer, Role
from race_core.sampling import Sample, Sampler, SamplingParams
from race_core.schema import Action, SchemaError, ToolCall, Trajectory, Turn

ROLLOUT_SOURCE_REVISION = f"on-policy-env-r{ENV_REVISION}"
ROLLOUT_FORMAT = "race.rollouts/v1"
_STEP_SEED_STRIDE = 1_000_003  # sampler seed of step s = seed + s * stride
_CHUNK_SEED_STRIDE = 7_919_009  # sampler seed of sample chunk c = seed + c * stride (rl.sample_chunk)


@dataclass(frozen=True)
class ParsedGeneration:
    """One generated assistant turn: its reasoning/action text, format verdict, per-token roles."""

    reasoning: str
    action: Action  # text, or the tool calls written ("" when malformed)
    well_formed: bool
    roles: tuple[int, ...]  # one per generated token (stop included)


@dataclass
class Rollout:
    """One on-policy episode. Token arrays are aligned: `token_ids[i]` has tag (turns[i], roles[i]),
    `policy_mask[i]` says the policy generated it and `old_logprobs[i]` is its log-prob under the
    sampling policy (0 where not generated)."""

    task_id: str
    group: int  # index of the task in the batch: rollouts of one task share it (GRPO group)
    sample_index: int
    question: str
    prompt_length: int
    token_ids: list[int] = field(default_factory=list)
    turn_tags: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    policy_mask: list[bool] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    well_formed: list[bool] = field(default_factory=list)
    success: bool = False
    reward: float = 0.0
    finished: bool = False
    system: str = ""  # the system prompt the policy played with
    tools: list[dict] = field(default_factory=list)  # the tools given to its chat template
    environment: str = ENVIRONMENT_NAME  # the `environment` of the trajectory it becomes

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "token_ids": np.asarray(self.token_ids, dtype=np.int64),
            "turns": np.asarray(self.turn_tags, dtype=np.int32),
            "roles": np.asarray(self.roles, dtype=np.int8),
            "policy_mask": np.asarray(self.policy_mask, dtype=bool),
            "old_logprobs": np.asarray(self.old_logprobs, dtype=np.float32),
        }

    @property
    def all_well_formed(self) -> bool:
        return all(self.well_formed)

    def reasoning_token_count(self, turn: int | None = None) -> int:
        """Generated reasoning tokens (of one turn, or of the whole episode)."""
        return sum(1 for t, r, p in zip(self.turn_tags, self.roles, self.policy_mask, strict=True)
                   if p and r == Role.REASONING and (turn is None or t == turn))

    def to_trajectory(self, source_revision: str = ROLLOUT_SOURCE_REVISION) -> Trajectory | None:
        """The successful, well-formed episode as a validated Trajectory (in the environment it was
        played in); None when it failed, has a malformed turn or breaks the schema."""
        if not self.success or not self.all_well_formed:
            return None
        record = {"question": self.question, "environment": self.environment, "source_revision": source_revision,
                  "split": "train", "successful": True, "turns": [t.to_dict() for t in self.turns],
                  "task_id": self.task_id, "system": self.system, "tools": list(self.tools)}
        try:
            return Trajectory.from_dict(record)
        except SchemaError:
            return None


def _char_ends(tokenizer, ids: Sequence[int]) -> list[int]:
    """For each token, where its text ends in `decode(ids)` (cumulative decoding, so a character
    split over byte tokens ends at its last byte's token)."""
    ends, last = [], 0
    for k in range(len(ids)):
        last = max(last, len(tokenizer.decode(ids[:k + 1], skip_special_tokens=False)))
        ends.append(last)
    return ends


def parse_tool_calls(text: str) -> tuple[ToolCall, ...]:
    """The tool calls written in `text`, in the formats chat templates use: every JSON object with a
    string `name` and an object `arguments` (or `parameters`), alone or in a JSON list, wherever it
    stands (Hermes `<tool_call>` blocks, Llama-3 JSON, Mistral `[TOOL_CALLS] [...]`). Arguments
    written as a JSON string of an object are decoded once. A text with no JSON call may hold
    `<tool_call>` blocks of Python-literal calls (`{'name': 'f', 'arguments': {...}}`, as the Hermes
    data sets write them), read by `race_core.importers.common.python_literal` (never eval)."""
    calls = _json_calls(text)
    if calls:
        return tuple(calls)
    from race_core.importers.common import python_literal

    for block in _TOOL_CALL_BLOCK.findall(text):
        value, why = python_literal(block)
        if why is None:
            calls.extend(c for item in (value if isinstance(value, list) else [value]) if (c := _as_call(item)))
    return tuple(calls)


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json_calls(text: str) -> list[ToolCall]:
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    at = 0
    while (at := _next_json(text, at)) >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            at += 1
            continue
        for item in value if isinstance(value, list) else [value]:
            if call := _as_call(item):
                calls.append(call)
        at = end
    return calls


def _next_json(text: str, start: int) -> int:
    found = [i for i in (text.find("{", start), text.find("[", start)) if i >= 0]
    return min(found) if found else -1


def _as_call(item) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ToolCall(item["name"], arguments) if isinstance(arguments, dict) else None


def parse_generation(renderer: Renderer, token_ids: Sequence[int], stopped: bool, actions: str = "text"
                     ) -> ParsedGeneration:
    """Split one generated turn into reasoning / action and tag each token with its role.

    `stopped` says the last token is the end-of-turn stop (the sampler's finish_reason "stop");
    `actions` is the agent's form of actions (`text`, or `tools`: calls in the template's format,
    whose leading whitespace is the action prefix, as the renderer renders calls). Roles come from
    the decoded text, as the renderer gives them: each token takes the role of its last character."""
    tokenizer = renderer.tokenizer
    body = list(token_ids[:-1] if stopped else token_ids)
    text = tokenizer.decode(body, skip_special_tokens=False)
    bounds = [(0, Role.ACTION)]  # (first character, role), in order
    reasoning, action, well_formed = "", "", False
    if text.startswith(OPEN_MARKER):
        bounds = [(0, Role.OPEN), (len(OPEN_MARKER), Role.REASONING)]
        close_at = text.find(CLOSE_MARKER, len(OPEN_MARKER))
        if close_at >= 0:
            after = close_at + len(CLOSE_MARKER)
            bounds += [(close_at, Role.CLOSE), (after, Role.ACTION)]
            reasoning = text[len(OPEN_MARKER):close_at]
            if actions == TOOLS:
                rest = text[after:]
                lead = len(rest) - len(rest.lstrip())
                if lead:
                    bounds[-1:] = [(after, Role.ACTION_PREFIX), (after + lead, Role.ACTION)]
                calls = parse_tool_calls(rest)
                if stopped and calls:
                    action, well_formed = calls, True
            elif text.startswith(ACTION_PREFIX, after):
                bounds[-1:] = [(after, Role.ACTION_PREFIX), (after + len(ACTION_PREFIX), Role.ACTION)]
                if stopped:
                    action, well_formed = text[after + len(ACTION_PREFIX):], True
    starts = [start for start, _ in bounds]
    roles = [int(bounds[max(bisect.bisect_right(starts, end - 1) - 1, 0)][1]) for end in _char_ends(tokenizer, body)]
    if stopped:
        roles.append(int(Role.END))
    return ParsedGeneration(reasoning=reasoning, action=action, well_formed=well_formed, roles=tuple(roles))


class _Episode:
    """The state of one running episode: its env and the rollout being built."""

    def __init__(self, renderer: Renderer, task: Task, group: int, sample_index: int, max_turns: int,
                 agent: AgentPrompt):
        self.renderer = renderer
        self.agent = agent
        self.env = task.environment.episode(task, max_turns)
        question = self.env.reset()
        prompt = renderer.prompt_ids(question, [], system=agent.system, tools=agent.tools)
        self.rollout = Rollout(task_id=task.task_id, group=group, sample_index=sample_index, question=question,
                               prompt_length=len(prompt), system=agent.system, tools=list(agent.tools),
                               environment=task.environment.environment)
        self._append(prompt, -1, Role.CONTEXT)

    def _append(self, ids: Sequence[int], turn: int | Sequence[int], role: Role | Sequence[int],
                policy: bool = False, logprobs: Sequence[float] | None = None) -> None:
        r = self.rollout
        r.token_ids.extend(int(i) for i in ids)
        r.turn_tags.extend([turn] * len(ids) if isinstance(turn, int) else [int(x) for x in turn])
        r.roles.extend([int(role)] * len(ids) if isinstance(role, Role) else [int(x) for x in role])
        r.policy_mask.extend([policy] * len(ids))
        r.old_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def done(self) -> bool:
        return self.env.done

    def advance(self, sample: Sample) -> None:
        """Append one generated turn, run its action in the env, then append the rest of the
        assistant message's closing, the observation and (unless done) the next opening, tokenized
        by the renderer as it renders them."""
        renderer, r = self.renderer, self.rollout
        turn = len(r.turns)
        stopped = sample.finish_reason == "stop" and len(sample.token_ids) > 0
        parsed = parse_generation(renderer, sample.token_ids, stopped, self.agent.actions)
        self._append(sample.token_ids, turn, parsed.roles, policy=True, logprobs=sample.logprobs)
        result = self.env.step(parsed.action if parsed.well_formed else "")
        r.turns.append(Turn(reasoning=parsed.reasoning, action=parsed.action, observation=result.observation))
        r.well_formed.append(parsed.well_formed)
        called = not isinstance(parsed.action, str) and renderer.tool_mode == TOOLS_TEMPLATE
        closing = renderer.assistant_end(tool_calls=called)
        if stopped:  # the stop token opened the closing wrapper: only its rest follows
            stop_text = renderer.tokenizer.decode(sample.token_ids[-1:], skip_special_tokens=False)
            closing = closing[len(stop_text):] if closing.startswith(stop_text) else closing
        tokens = renderer.tokenize([(closing, turn, Role.END),
                                    *renderer.observation_segments(turn, result.observation, not result.done,
                                                                   tool_result=called)])
        self._append(tokens.ids, tokens.turns, tokens.roles)
        if result.done:
            r.success, r.reward, r.finished = self.env.success, self.env.reward, self.env.finished


def run_rollouts(
    sampler: Sampler,
    renderer: Renderer,
    tasks: Sequence[Task],
    group_size: int = 1,
    params: SamplingParams | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    first_group: int = 0,
    agent: AgentPrompt | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[Rollout]:
    """Play `group_size` episodes of every task; one sampler call per step over all unfinished
    episodes. Rollouts come back task-major: tasks[0] sample 0..G-1, tasks[1] ..., with `group`
    = `first_group` + the task's index. `agent`: the prompt to play with (default: the one the
    renderer's tokenizer carries, `AgentPrompt.of`). `progress(step, finished, episodes)` is called
    after each step (a step is one turn of every unfinished episode)."""
    params = params or SamplingParams()
    agent = agent or AgentPrompt.of(renderer.tokenizer)
    episodes = [_Episode(renderer, task, first_group + k, g, max_turns, agent)
                for k, task in enumerate(tasks) for g in range(group_size)]
    step = 0
    while active := [e for e in episodes if not e.done]:
        step_params = replace(params, n=1, seed=params.seed + step * _STEP_SEED_STRIDE)
        samples = sampler.sample([e.rollout.token_ids for e in active], step_params)
        for episode, per_prompt in zip(active, samples, strict=True):
            episode.advance(per_prompt[0])
        step += 1
        if progress is not None:
            progress(step, sum(e.done for e in episodes), len(episodes))
    return [e.rollout for e in episodes]



def play_episodes(
    model,
    tokenizer,
    tasks: Sequence[Task],
    group_size: int,
    params: SamplingParams,
    max_turns: int = DEFAULT_MAX_TURNS,
    *,
    batch_size: int = 32,
    first_group: int = 0,
    agent: AgentPrompt | None = None,
    sampler: Sampler | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[Rollout]:
    """`run_rollouts` with an HFSampler over the in-memory `model` (on whatever device and dtype it
    was loaded with), or with `sampler` (another backend over the same policy, e.g. vLLM's; then
    `model` and `tokenizer` may be None)."""
    from race_core.sampling.hf import HFSampler

    if sampler is None:
        sampler = HFSampler(model, tokenizer, renderer=Renderer(tokenizer), batch_size=batch_size)
    return run_rollouts(sampler, sampler.renderer, tasks, group_size, params, max_turns, first_group, agent, progress)


def training_tasks(config: RLConfig, iteration: int) -> list[Task]:
    """The K tasks of RL iteration `iteration` (config.env's training split, seed config.seed + iteration)."""
    return get_environment(config.env).generate_tasks(config.tasks_per_iteration, config.seed + iteration,
                                                      config.difficulty, split="train", shape=config.shape)


def sample_chunks(config: RLConfig) -> list[tuple[int, int]]:
    """The [start, stop) task ranges sampled together: `config.sample_chunk` tasks each, or one
    range of all K when it is 0."""
    size = config.sample_chunk or max(config.tasks_per_iteration, 1)
    return [(start, min(start + size, config.tasks_per_iteration))
            for start in range(0, config.tasks_per_iteration, size)]


def sample_rollouts(model, tokenizer, config: RLConfig, iteration: int, chunk: int | None = None, *,
                    sampler: Sampler | None = None) -> list[Rollout]:
    """G rollouts for each of the K training tasks of `iteration` from the policy `model`; their
    log-probs are the update's logp_old. `chunk` c (of `sample_chunks`) plays only its tasks, with
    sampler seed config.seed + iteration + c * stride, so a chunk's rollouts depend on the policy,
    the config and c alone, not on where or beside what it runs; None plays every chunk in turn
    (with `sample_chunk` 0: one draw of all K tasks at seed config.seed + iteration). `sampler`: as
    in `play_episodes`."""
    ranges = sample_chunks(config)
    if chunk is None:
        return [r for c in range(len(ranges))
                for r in sample_rollouts(model, tokenizer, config, iteration, c, sampler=sampler)]
    start, stop = ranges[chunk]
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
                            seed=config.seed + iteration + chunk * _CHUNK_SEED_STRIDE)
    return play_episodes(model, tokenizer, training_tasks(config, iteration)[start:stop], config.group_size, params,
                         config.max_turns, first_group=start, sampler=sampler)


def sample_successful_trajectories(model, tokenizer, tasks: int, samples: int, seed: int,
                                   temperature: float = 1.0, shape: str = "random", difficulty: int | None = None,
                                   env: str = DEFAULT_ENV) -> tuple[list[Trajectory], int]:
    """Play `samples` episodes of each of `tasks` training tasks of environment `env` (seed `seed`,
    `shape`, `difficulty`); return the successful, well-formed ones as Trajectories (the policy's own
    data, RACE's input; one per distinct trajectory) and the number of episodes played."""
    params = SamplingParams(temperature=temperature, seed=seed)
    drawn = get_environment(env).generate_tasks(tasks, seed, difficulty, split="train", shape=shape)
    rollouts = play_episodes(model, tokenizer, drawn, samples, params)
    trajectories = {t.id: t for r in rollouts if (t := r.to_trajectory()) is not None}
    return list(trajectories.values()), len(rollouts)


def rollouts_to_json(rollouts: Sequence[Rollout]) -> str:
    """The rollouts as JSON; a calculator rollout's `environment` is left out (its bytes stay what
    they were before environments had names; `rollouts_from_json` restores it)."""
    records = [asdict(r) for r in rollouts]
    for record in records:
        if record["environment"] == ENVIRONMENT_NAME:
            del record["environment"]
    return json.dumps({"format": ROLLOUT_FORMAT, "rollouts": records})


def rollouts_from_json(text: str) -> list[Rollout]:
    payload = json.loads(text)
    if payload.get("format") != ROLLOUT_FORMAT:
        raise ValueError(f"not a rollouts document (format {payload.get('format')!r}, expected {ROLLOUT_FORMAT})")
    rollouts = []
    for record in payload["rollouts"]:
        record["turns"] = [Turn(**t) for t in record["turns"]]
        rollouts.append(Rollout(**record))
    return rollouts

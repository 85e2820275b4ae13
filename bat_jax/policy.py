"""The policy side of the loop: model + tokenizer + rollout engine, and the glue from benchmark tasks and
Stage Bank rows to agent-loop requests, and from trajectories back to verifier evidence.

`build_policy` gives the embedded tiny default (a randomly initialised tiny Qwen3.5 on the shipped tiny
tokenizer) or loads a local Hugging Face checkpoint directory (Qwen3.5 / Qwen3), failing with the missing path
named. `EngineCells` is the held-out evaluator's CellRunner for a token-level policy: one episode per cell
through the same `AgentLoop` that GRPO rollouts use, scored by the rubric verifier and the task metric.

Prompt styles (`PolicyConfig.prompt_style`, one switch for SFT rendering, GRPO rollouts, evaluation and the KL
probe): 'full' (paper scale) prompts with `AGENT_SYSTEM_PROMPT`, the chat template's tools block and the
brief + stage skills as written; 'compact' (small policies, issue 15) with `COMPACT_SYSTEM_PROMPT` naming the
two tools (no tools block) and the first user turn rewritten by `tasks.brief.compact_user_message`. Either way
the turn is rendered through `models.episode.EpisodeBuilder`: its text never becomes control ids.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flax import nnx

from bat_jax.benchmark.evaluator import EvalJob
from bat_jax.benchmark.scoring import Cell
from bat_jax.benchmark.stages import STAGES
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest, cut_observation
from bat_jax.rollout.trajectory import Trajectory
from bat_jax.sandbox.types import SandboxState
from bat_jax.verify.rubric import Evidence

FAMILIES = ("qwen3_5", "qwen3", "chatml")
PROMPT_STYLES = ("full", "compact")

#: System prompt of the token-level agent in the 'full' style (the tools block of the chat template carries
#: the tool schemas).
AGENT_SYSTEM_PROMPT = ("You are a medical-imaging research agent. Work through the stages of the task using the "
                       "tools: execute_code runs python or bash in the workspace, submit hands in the final file.")
#: System prompt of the 'compact' style: the two tools and their parameters (no tools block).
COMPACT_SYSTEM_PROMPT = ("Imaging agent. Tools: execute_code(language: python|bash, code) runs code in the "
                         "workspace; submit(path) hands in the result.")


def user_message(brief: str, skill: str, style: str = "full") -> str:
    """The first user turn: the task brief and the stage skill κ (the same layout the teacher saw); in the
    'compact' style rewritten by `tasks.brief.compact_user_message`. Raises ValueError for an unknown style."""
    return style_user_message(f"{brief}\n\n## Stage skill\n{skill}", style)


def style_user_message(text: str, style: str) -> str:
    """A full first user turn `text` in prompt style `style`. Raises ValueError for an unknown style."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "full":
        return text
    from bat_jax.tasks.brief import compact_user_message

    return compact_user_message(text)


def prompt_head(style: str) -> tuple[str, tuple[dict, ...]]:
    """(system prompt, tool schemas for the template's tools block) of a prompt style; the compact style names
    the tools in its system prompt and leaves the tools block out. Raises ValueError for an unknown style."""
    from bat_jax.models.chat import tool_schemas

    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    return (AGENT_SYSTEM_PROMPT, tuple(tool_schemas())) if style == "full" else (COMPACT_SYSTEM_PROMPT, ())


def first_messages(brief: str, skill: str, style: str = "full") -> tuple[list[dict], list[dict]]:
    """(system + first user message, tools) of a prompt: what `EpisodeBuilder.start` takes."""
    system, tools = prompt_head(style)
    return ([{"role": "system", "content": system}, {"role": "user", "content": user_message(brief, skill, style)}],
            [dict(t) for t in tools])


def request(state_id: str, state: SandboxState, brief: str, skill: str, stage: str,
            style: str = "full") -> RolloutRequest:
    """The agent-loop request of one episode: start state, brief and skill κ rendered in `style`."""
    system, tools = prompt_head(style)
    return RolloutRequest(state_id=state_id, state=state, system_prompt=system,
                          user_message=user_message(brief, skill, style), tools=tools, stage=stage)


def rl_request(row: Any, state: SandboxState, round_state_id: str | None = None,
               style: str = "full") -> RolloutRequest:
    """The agent-loop request of one Stage Bank RL row (state p, prompt, skill κ) in prompt style `style`."""
    return request(round_state_id or row.state_id, state, row.prompt, row.skill, row.focus, style)


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Which policy to train.

    Attributes:
      family: 'qwen3_5' (paper), 'qwen3' or 'chatml'. For the tiny default it picks the architecture (Qwen3.5
        hybrid or Qwen3 dense; 'chatml' needs a checkpoint); turns are always rendered with the shipped tokenizer's
        Qwen3.5 template. For a checkpoint it names the chat family of the checkpoint's template (the architecture
        comes from its config.json; `models.chat.MODEL_CHAT_FAMILY` gives each model family's own, e.g. 'chatml'
        for the Llama SmolLM2 from `python -m bat_jax.models.gguf_import`).
      checkpoint_dir: a local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files);
        None = the embedded tiny default (random init + the shipped tiny tokenizer).
      tiny: model-config overrides of the tiny default (e.g. hidden_size, num_hidden_layers).
      dtype: compute dtype ('float32' on CPU, 'bfloat16' on GPU/TPU).
      seed: parameter-init seed of the tiny default.
      prompt_style: 'full' (paper scale: full system prompt, tools block, brief and skills) or 'compact'
        (small policies: short system prompt naming the tools, terse brief and one-line skills).
    """

    family: str = "qwen3_5"
    checkpoint_dir: str | None = None
    tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    seed: int = 0
    prompt_style: str = "full"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"PolicyConfig.family must be one of {FAMILIES}, got {self.family!r}")
        if self.family == "chatml" and self.checkpoint_dir is None:
            raise ValueError("PolicyConfig.family 'chatml' needs a checkpoint_dir (the tiny default is Qwen)")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"PolicyConfig.prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}")


@dataclasses.dataclass
class Policy:
    """A model with its tokenizer, the chat family of the tokenizer's template (`family`: how turns and
    tool calls are rendered; the shipped tiny tokenizer carries the Qwen3.5 template whatever the model) and
    the prompt style its turns are rendered in (`PROMPT_STYLES`)."""

    model: nnx.Module
    tokenizer: Any
    family: str
    prompt_style: str = "full"


def build_policy(config: PolicyConfig) -> Policy:
    """The tiny default or a local HF checkpoint.

    Raises:
      FileNotFoundError: `checkpoint_dir` (or its config.json) does not exist — the message names the path.
    """
    if config.checkpoint_dir is not None:
        path = pathlib.Path(config.checkpoint_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"policy checkpoint directory {path} has no config.json; download the Hugging Face checkpoint "
                f"there or bind PolicyConfig.checkpoint_dir to a local copy")
        from transformers import AutoTokenizer

        from bat_jax.models import hf_io

        model = hf_io.load_pretrained(path, dtype=config.dtype)
        return Policy(model, AutoTokenizer.from_pretrained(str(path)), config.family, config.prompt_style)
    from bat_jax.models.tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    overrides = {"vocab_size": len(tokenizer), "dtype": config.dtype, **dict(config.tiny)}
    if config.family == "qwen3_5":
        from bat_jax.models.configs import Qwen3_5Config
        from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

        model = Qwen3_5ForCausalLM(Qwen3_5Config(**overrides), rngs=nnx.Rngs(config.seed))
    else:
        from bat_jax.models.configs import Qwen3Config
        from bat_jax.models.qwen3 import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**overrides), rngs=nnx.Rngs(config.seed))
    return Policy(model, tokenizer, "qwen3_5", config.prompt_style)  # the shipped tokenizer's chat template


def make_agent_loop(policy: Policy, engine: Any, make_sandbox: Any, config: AgentLoopConfig,
                    sandbox_release: Any = None) -> AgentLoop:
    """An AgentLoop over `engine` with the policy's chat template (token in, token out). `make_sandbox` /
    `sandbox_release`: where episodes get and give back sandboxes (`sandbox.backends.SandboxBackend.make` /
    `.release`; release None = close each one)."""
    from bat_jax.models.episode import EpisodeBuilder

    im_start = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    return AgentLoop(engine, lambda: EpisodeBuilder(policy.tokenizer, policy.family), make_sandbox, config,
                     sandbox_release=sandbox_release, extra_stop_ids=(im_start,))


def evidence_of(trajectory: Trajectory, start: SandboxState) -> Evidence:
    """Verifier evidence of one trajectory: receipts, the final workspace (start files overlaid with the
    episode's changed files) and the submitted path; an infrastructure failure is carried as unscored."""
    files = {**dict(start.files), **dict(trajectory.artefacts)}
    for path in trajectory.skipped_artefacts:  # over a cap: absent, never the stale start version
        files.pop(path, None)
    return Evidence(tuple(trajectory.receipts), files, trajectory.submitted, infra_error=trajectory.infra_error,
                    agent_error=trajectory.agent_error, skipped=tuple(trajectory.skipped_artefacts),
                    start_files=dict(start.files))


@dataclasses.dataclass
class EngineCells:
    """CellRunner for a token-level policy: one E2E episode per held-out cell through the AgentLoop.
    `judge` (a `verify.judge.RubricJudge`, optional) decides its rubric items; a cell it cannot decide is
    unscored. Prompts are rendered in `prompt_style`. After each call, `agent_failed` is the number of its cells whose sandbox the agent's own code
    brought down (`Trajectory.agent_error`) and that were still scored (`Cell.scored`), as the ledger counts
    them; scoring is not changed by it."""

    loop: AgentLoop
    judge: Any = None
    agent_failed: int = 0
    prompt_style: str = "full"

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        from bat_jax.stage_bank.slicing import row_skill
        from bat_jax.tasks.registry import TRACKS
        from bat_jax.tasks.rubric_items import build_rubric
        from bat_jax.verify.rubric import score

        requests = [request(f"eval-{i}", job.task.state(), job.task.brief, row_skill("E2E"), "E2E", self.prompt_style)
                    for i, job in enumerate(jobs)]
        trajectories = self.loop.run(requests, seed=jobs[0].seed if jobs else 0)
        by_request = {t.state_id: t for t in trajectories}
        cells = []
        for i, job in enumerate(jobs):
            trajectory = by_request[f"eval-{i}"]
            track = TRACKS[job.track]
            evidence = evidence_of(trajectory, requests[i].state)
            task = None if evidence.infra_error else track.score_task(job.task, evidence.files, evidence.submitted)
            rubric = build_rubric(track, job.task)
            if self.judge is not None:
                rubric = self.judge.apply(rubric)
            cells.append(score(rubric, evidence, task, STAGES).to_cell(job.track, job.repeat))
        self.agent_failed = sum(bool(by_request[f"eval-{i}"].agent_error) and cell.scored()
                                for i, cell in enumerate(cells))
        return cells


def render_sft_row(row: Any, policy: Policy, max_seq_len: int, max_observation_chars: int | None = None,
                   all_turns: bool = False) -> dict[str, np.ndarray] | None:
    """Tokenised SFT example of a Stage Bank SFT row in the policy's chat template (DESIGN: rows are
    model-neutral; the adapter renders them): context (system, user, prior assistant actions and tool
    observations) as the prompt, the one target action + `<|im_end|>` as the response (loss mask 1).
    With `max_observation_chars`, each tool observation is cut exactly as the agent loop cuts it at rollout
    time (`rollout.agent_loop.cut_observation`), so SFT contexts look like the contexts the policy acts in.
    The system prompt and first user turn are those of `policy.prompt_style` (the teacher's system message
    is replaced). Only the template's own tags become control ids: the brief, skill, observations and the teacher's
    thoughts and arguments are ordinary text whatever they contain (`models.episode.TextCodec`).

    With `all_turns`, the context's earlier assistant actions (each + `<|im_end|>`) carry loss too: the row then
    trains every earlier row of its teacher trajectory at once, each action with exactly its own context
    (causal attention), as `trajectory_examples` uses it.

    Returns `{'input_ids','attention_mask','loss_mask'}` `[max_seq_len]` int32, or None when the row does not
    fit in `max_seq_len` tokens (never truncated: a cut action would teach the model to stop mid-call).
    """
    from bat_jax.learn.sft import build_sft_example
    from bat_jax.models.chat import render_action
    from bat_jax.models.episode import EpisodeBuilder

    builder = EpisodeBuilder(policy.tokenizer, policy.family)
    users = [m for m in row.context if m.role == "user"]
    if not users:
        raise ValueError(f"SFT row {row.row_id}: context has no user message")
    start = row.context.index(users[0]) + 1
    system, tools = prompt_head(policy.prompt_style)
    builder.start([{"role": "system", "content": system},
                   {"role": "user", "content": style_user_message(users[0].content, policy.prompt_style)}],
                  tools=[dict(t) for t in tools])
    rest = row.context[start:]
    for message in rest:
        if message.role == "assistant":
            builder.add_assistant_text(render_action(message.action, policy.family))
        else:
            builder.add_tool_response(message.content if max_observation_chars is None
                                      else cut_observation(message.content, max_observation_chars))
    context = builder.build()
    prompt = context.ids.tolist()
    response = builder.encode(render_action(row.target, policy.family))
    if len(prompt) + len(response) + 1 > max_seq_len:
        return None
    example = build_sft_example(prompt, response, builder.eot_id, max_seq_len)
    if all_turns:
        example["loss_mask"][: len(prompt)] = context.loss_mask
    return example


def trajectory_key(row: Any) -> tuple[str, int] | None:
    """(teacher trajectory digest, turn) of an SFT row, from its provenance's `sft_slice` step; None if absent."""
    for step in reversed(tuple(row.provenance.transformations)):
        if step.name == "sft_slice":
            return str(step.params["trajectory"]), int(step.params["turn"])
    return None


def trajectory_examples(rows: Sequence[Any], policy: Policy, max_seq_len: int,
                        max_observation_chars: int | None = None) -> list[dict[str, np.ndarray]]:
    """SFT examples with loss on every expert action: per teacher trajectory (`trajectory_key`) only its
    latest-turn row that fits `max_seq_len`, rendered with `all_turns`, which holds the targets of all its
    earlier rows with their exact contexts; rows without an `sft_slice` step are rendered on their own.
    Examples as `render_sft_row`'s, in the order of the rows kept."""
    best: dict[str, tuple[int, dict]] = {}
    out: list[dict[str, np.ndarray]] = []
    for row in rows:
        key = trajectory_key(row)
        example = render_sft_row(row, policy, max_seq_len, max_observation_chars, all_turns=key is not None)
        if example is None:
            continue
        if key is None:
            out.append(example)
        elif key[0] not in best or key[1] > best[key[0]][0]:
            best[key[0]] = (key[1], example)
    return out + [example for _, example in best.values()]


def sft_bucket(length: int, max_seq_len: int) -> int:
    """Tokens an SFT batch whose longest row has `length` tokens is padded to: the smallest of 256, 384, 512,
    768, 1024, 1536, ... (powers of two and their 1.5 multiples) that holds it, at most `max_seq_len`.

    Raises:
      ValueError: `length` > `max_seq_len`.
    """
    if length > max_seq_len:
        raise ValueError(f"an SFT row of {length} tokens exceeds max_seq_len={max_seq_len}")
    size = 256
    while size < length:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 256 → 384 → 512 → 768 → 1024 ...
    return min(size, max_seq_len)


def sft_batch(examples: Sequence[Mapping[str, np.ndarray]], batch_size: int, rng: np.random.Generator,
              max_seq_len: int) -> dict[str, np.ndarray]:
    """One SFT batch `{'input_ids','attention_mask','loss_mask'}` `[batch_size, T]` int32 of rendered rows
    (`render_sft_row` output, `[max_seq_len]` each), padded only to the bucket of its longest row
    (`sft_bucket`), so that a step on short rows does not pay for `max_seq_len` tokens.

    The first row is drawn uniformly; the others uniformly from the rows of the same bucket (with replacement
    when the bucket has fewer than `batch_size` rows), so every row is drawn equally often on average.

    Raises:
      ValueError: no examples.
    """
    if not examples:
        raise ValueError("sft_batch: no examples")
    buckets = [sft_bucket(int(e["attention_mask"].sum()), max_seq_len) for e in examples]
    first = int(rng.integers(len(examples)))
    same = [i for i, b in enumerate(buckets) if b == buckets[first]]
    others = rng.choice(same, size=batch_size - 1, replace=len(same) < batch_size - 1) if batch_size > 1 else []
    from bat_jax.learn.learner import pad_batch

    t = buckets[first]
    return pad_batch([{k: np.asarray(v)[:t] for k, v in examples[i].items()} for i in [first, *others]],
                     multiple=1, pad_to=t)

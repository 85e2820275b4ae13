"""The policy side of the loop: model + tokenizer + rollout engine, and the glue from benchmark tasks and
Stage Bank rows to agent-loop requests, and from trajectories back to verifier evidence.

`build_policy` gives the embedded tiny default (a randomly initialised tiny Qwen3.5 on the shipped tiny
tokenizer) or loads a local Hugging Face checkpoint directory (Qwen3.5 / Qwen3), failing with the missing path
named. `EngineCells` is the held-out evaluator's CellRunner for a token-level policy: one episode per cell
through the same `AgentLoop` that GRPO rollouts use, scored by the rubric verifier and the task metric.
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

FAMILIES = ("qwen3_5", "qwen3")

#: System prompt of the token-level agent (SFT rendering, GRPO rollouts and evaluation all use it; the tools
#: block of the chat template carries the tool schemas).
AGENT_SYSTEM_PROMPT = ("You are a medical-imaging research agent. Work through the stages of the task using the "
                       "tools: execute_code runs python or bash in the workspace, submit hands in the final file.")


def user_message(brief: str, skill: str) -> str:
    """The first user turn: the task brief and the stage skill κ (the same layout the teacher saw)."""
    return f"{brief}\n\n## Stage skill\n{skill}"


def rl_request(row: Any, state: SandboxState, round_state_id: str | None = None) -> RolloutRequest:
    """The agent-loop request of one Stage Bank RL row (state p, prompt, skill κ)."""
    return RolloutRequest(state_id=round_state_id or row.state_id, state=state, system_prompt=AGENT_SYSTEM_PROMPT,
                          user_message=user_message(row.prompt, row.skill), stage=row.focus)


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Which policy to train.

    Attributes:
      family: 'qwen3_5' (paper) or 'qwen3'. For the tiny default it picks the architecture (Qwen3.5 hybrid or
        Qwen3 dense); turns are always rendered with the shipped tokenizer's Qwen3.5 template. For a checkpoint it
        names the chat family of the checkpoint's template (the architecture comes from its config.json).
      checkpoint_dir: a local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files);
        None = the embedded tiny default (random init + the shipped tiny tokenizer).
      tiny: model-config overrides of the tiny default (e.g. hidden_size, num_hidden_layers).
      dtype: compute dtype ('float32' on CPU, 'bfloat16' on GPU/TPU).
      seed: parameter-init seed of the tiny default.
    """

    family: str = "qwen3_5"
    checkpoint_dir: str | None = None
    tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"PolicyConfig.family must be one of {FAMILIES}, got {self.family!r}")


@dataclasses.dataclass
class Policy:
    """A model with its tokenizer and the chat family of the tokenizer's template (`family`: how turns and
    tool calls are rendered; the shipped tiny tokenizer carries the Qwen3.5 template whatever the model)."""

    model: nnx.Module
    tokenizer: Any
    family: str


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
        return Policy(model, AutoTokenizer.from_pretrained(str(path)), config.family)
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
    return Policy(model, tokenizer, "qwen3_5")  # the shipped tokenizer's chat template


def make_agent_loop(policy: Policy, engine: Any, make_sandbox: Any, config: AgentLoopConfig) -> AgentLoop:
    """An AgentLoop over `engine` with the policy's chat template (token in, token out)."""
    from bat_jax.models.episode import EpisodeBuilder

    im_start = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    return AgentLoop(engine, lambda: EpisodeBuilder(policy.tokenizer, policy.family), make_sandbox, config,
                     extra_stop_ids=(im_start,))


def evidence_of(trajectory: Trajectory, start: SandboxState) -> Evidence:
    """Verifier evidence of one trajectory: receipts, the final workspace (start files overlaid with the
    episode's changed files) and the submitted path; an infrastructure failure is carried as unscored."""
    files = {**dict(start.files), **dict(trajectory.artefacts)}
    for path in trajectory.skipped_artefacts:  # over a cap: absent, never the stale start version
        files.pop(path, None)
    return Evidence(tuple(trajectory.receipts), files, trajectory.submitted, infra_error=trajectory.infra_error,
                    agent_error=trajectory.agent_error, skipped=tuple(trajectory.skipped_artefacts))


@dataclasses.dataclass
class EngineCells:
    """CellRunner for a token-level policy: one E2E episode per held-out cell through the AgentLoop.
    `judge` (a `verify.judge.RubricJudge`, optional) decides its rubric items; a cell it cannot decide is
    unscored. After each call, `agent_failed` is the number of its cells whose sandbox the agent's own code
    brought down (`Trajectory.agent_error`) and that were still scored (`Cell.scored`), as the ledger counts
    them; scoring is not changed by it."""

    loop: AgentLoop
    judge: Any = None
    agent_failed: int = 0

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        from bat_jax.stage_bank.slicing import row_skill
        from bat_jax.tasks.registry import TRACKS
        from bat_jax.tasks.rubric_items import build_rubric
        from bat_jax.verify.rubric import score

        requests = [RolloutRequest(state_id=f"eval-{i}", state=job.task.state(), system_prompt=AGENT_SYSTEM_PROMPT,
                                   user_message=user_message(job.task.brief, row_skill("E2E")), stage="E2E")
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
                rubric = self.judge.apply(rubric, job.task.layout)
            cells.append(score(rubric, evidence, task, STAGES).to_cell(job.track, job.repeat))
        self.agent_failed = sum(bool(by_request[f"eval-{i}"].agent_error) and cell.scored()
                                for i, cell in enumerate(cells))
        return cells


def _tool_action(action) -> Any:
    from bat_jax.models.chat import ToolAction

    return ToolAction(thought=action.text, tool=action.tool or "stop", arguments=dict(action.arguments))


def render_sft_row(row: Any, policy: Policy, max_seq_len: int,
                   max_observation_chars: int | None = None) -> dict[str, np.ndarray] | None:
    """Tokenised SFT example of a Stage Bank SFT row in the policy's chat template (DESIGN: rows are
    model-neutral; the adapter renders them): context (system, user, prior assistant actions and tool
    observations) as the prompt, the one target action + `<|im_end|>` as the response (loss mask 1).
    With `max_observation_chars`, each tool observation is cut exactly as the agent loop cuts it at rollout
    time (`rollout.agent_loop.cut_observation`), so SFT contexts look like the contexts the policy acts in.
    Only the template's own tags become control ids: the brief, skill, observations and the teacher's
    thoughts and arguments are ordinary text whatever they contain (`models.episode.TextCodec`).

    Returns `{'input_ids','attention_mask','loss_mask'}` `[max_seq_len]` int32, or None when the row does not
    fit in `max_seq_len` tokens (never truncated: a cut action would teach the model to stop mid-call).
    """
    from bat_jax.learn.sft import build_sft_example
    from bat_jax.models.chat import render_action, tool_schemas
    from bat_jax.models.episode import EpisodeBuilder

    builder = EpisodeBuilder(policy.tokenizer, policy.family)
    users = [m for m in row.context if m.role == "user"]
    if not users:
        raise ValueError(f"SFT row {row.row_id}: context has no user message")
    start = row.context.index(users[0]) + 1
    builder.start([{"role": "system", "content": AGENT_SYSTEM_PROMPT}, {"role": "user", "content": users[0].content}],
                  tools=tool_schemas())
    rest = row.context[start:]
    for message in rest:
        if message.role == "assistant":
            builder.add_assistant_text(render_action(_tool_action(message.action), policy.family))
        else:
            builder.add_tool_response(message.content if max_observation_chars is None
                                      else cut_observation(message.content, max_observation_chars))
    prompt = builder.build().ids.tolist()
    response = builder.encode(render_action(_tool_action(row.target), policy.family))
    if len(prompt) + len(response) + 1 > max_seq_len:
        return None
    return build_sft_example(prompt, response, builder.eot_id, max_seq_len)

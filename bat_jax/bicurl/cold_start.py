"""The SFT cold start (paper Appendix A.4) and the round-0 evaluation a resumed run reads back.

`sft_cold_start` trains the learner once on the bank's SFT rows, before the first round; `save_round0` writes the
SFT policy's controller evaluation (round 0 of the ledger's story) beside its rubric item counts, and
`load_round0` / `round0_items` read them back when a killed run resumes.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import Summary
from bat_jax.bicurl.sft_data import render_sft_row, sft_batch, trajectory_examples
from bat_jax.curriculum.controller import Evaluation
from bat_jax.errors import ConfigValueError
from bat_jax.learn.learner import Learner
from bat_jax.learn.sft import SFTConfig
from bat_jax.policy import Policy
from bat_jax.prompts import PromptFormat
from bat_jax.stage_bank.row import SFTRow

#: The round-0 evaluation's file in the run directory.
ROUND0_FILE = "round0_eval.json"
#: What each sequence of the cold start holds (`BiCuRLConfig.sft_targets`).
SFT_TARGETS = ("row", "trajectory")


def sft_examples(rows: Sequence[SFTRow], policy: Policy, prompt: PromptFormat, config: SFTConfig, targets: str,
                 max_observation_chars: int) -> list[dict[str, np.ndarray]]:
    """The cold start's tokenised sequences: one per row or per teacher trajectory.

    `config` picks 'row' (paper Eq. 9) or 'trajectory'. Rows or trajectories longer than `config.max_seq_len` are left
    out.

    Raises:
      ConfigValueError: no row fits `config.max_seq_len` (naming the binding).
    """
    if targets == "trajectory":
        examples = trajectory_examples(rows, policy, prompt, config.max_seq_len, max_observation_chars)
    else:
        examples = [e for e in (render_sft_row(row, policy, prompt, config.max_seq_len, max_observation_chars)
                                for row in rows) if e is not None]
    if not examples:
        raise ConfigValueError(f"no SFT {'trajectory' if targets == 'trajectory' else 'row'} of the Stage Bank's "
                               f"{len(rows)} SFT rows fits sft.SFTConfig.max_seq_len = {config.max_seq_len}; bind a "
                               f"larger one")
    return examples


def sft_cold_start(learner: Learner, policy: Policy, prompt: PromptFormat, rows: Sequence[SFTRow],
                   config: SFTConfig, targets: str, seed: int, max_observation_chars: int) -> None:
    """SFT on the bank's SFT rows: loss on each target action (+ end of turn), paper Appendix A.4.

    Observations in the context are cut to `max_observation_chars`, as rollouts cut them. Each batch is padded
    to the length bucket of its rows (`sft_data.sft_batch`), not to `max_seq_len`; `seed` draws the batches.
    The learner adopts the final parameters.

    Raises:
      ConfigValueError: no row fits `config.max_seq_len` (naming the binding).
    """
    rows = list(rows)
    examples = sft_examples(rows, policy, prompt, config, targets, max_observation_chars)
    actions = sum(int(np.sum(np.diff(e["loss_mask"], prepend=0) == 1)) for e in examples)
    print(f"[bat_jax] SFT cold start: {len(examples)} sequences holding {actions} of the {len(rows)} rows' target "
          f"actions within {config.max_seq_len} tokens; {config.total_steps} steps × {config.global_batch_size} "
          f"(about {config.total_steps * config.global_batch_size / len(examples):.0f} passes)",
          flush=True)
    sft_steps(learner, examples, config, seed, "SFT")


def sft_steps(learner: Learner, examples: Sequence[dict[str, np.ndarray]], config: SFTConfig, seed: int,
              desc: str) -> float:
    """`config.total_steps` SFT steps from the learner's parameters with a fresh optimizer state.

    The learner adopts the result; `seed` draws the batches (`sft_data.sft_batch`). Returns the last batch's
    token-mean NLL (nats)."""
    step_fn, state = learner.sft_block(config, config.total_steps)
    rng = np.random.default_rng(seed)
    bar = tqdm(range(config.total_steps), desc=desc, unit="step")
    nll = float("nan")
    for i in bar:
        state, metrics = step_fn(state, sft_batch(examples, config.global_batch_size, rng, config.max_seq_len))
        if i % 10 == 9 or i == config.total_steps - 1:
            nll = float(metrics["nll"])  # token-mean NLL of this batch's target actions
            bar.set_postfix(nll=f"{nll:.3f}")
    learner.adopt(state)
    return nll


def rehearse(learner: Learner, policy: Policy, prompt: PromptFormat, rows: Sequence[SFTRow], config: SFTConfig,
             targets: str, seed: int, max_observation_chars: int) -> tuple[int, float]:
    """Rehearsal after a round's GRPO block: `config.total_steps` SFT steps on the SFT rows of every stage.

    An update aimed at one stage moves every stage's actions through the shared parameters; rehearsing the
    teacher's actions keeps the other stages near them (replay against forgetting; PPO-ptx, Ouyang et al. 2022,
    mixes the pretraining loss into the RL objective for the same reason). Returns (sequences, the last batch's NLL).

    Raises:
      ConfigValueError: no row fits `config.max_seq_len`.
    """
    examples = sft_examples(list(rows), policy, prompt, config, targets, max_observation_chars)
    return len(examples), sft_steps(learner, examples, config, seed, "rehearsal")


def save_round0(run_dir: pathlib.Path, summary: Summary, jobs: Sequence | None = None) -> Evaluation:
    """Writes the SFT policy's controller evaluation (round 0), its rubric item counts and which jobs it played.

    `jobs`: the evaluation's cells (`evaluation.EvalJob`), recorded as `round0_jobs` digests them (held-out task ids
    never leave the evaluator: the leakage firewall). Returns the evaluation as `load_round0` reads it back."""
    record = {**Evaluation.from_summary(summary).to_dict(), "items": summary.items.to_dict()}
    if jobs is not None:
        record["jobs"] = round0_jobs(jobs)
    atomic_write(pathlib.Path(run_dir) / ROUND0_FILE, json.dumps(record).encode())
    return load_round0(run_dir)


def round0_jobs(jobs: Sequence) -> dict:
    """The digest of a set of `evaluation.EvalJob`s: what makes two evaluations paired, without held-out task ids.

    Returns `{"count", "sha256"}` over the sorted `[track, repeat, task id, seed]` of the jobs."""
    keys = sorted([j.track, j.repeat, j.task.task_id, j.seed] for j in jobs)
    return {"count": len(keys), "sha256": hashlib.sha256(json.dumps(keys).encode()).hexdigest()}


def round0_matches(run_dir: pathlib.Path, jobs: Sequence) -> bool:
    """Whether the round-0 evaluation in `run_dir` played exactly `jobs` (this run's controller evaluation).

    A file that records no jobs (written before they were recorded) matches when its scored cells are `jobs`'
    (track, repeat) keys."""
    record = json.loads((pathlib.Path(run_dir) / ROUND0_FILE).read_text())
    if "jobs" in record:
        return record["jobs"] == round0_jobs(jobs)
    cells = record.get("cells")
    return cells is None or sorted(map(list, cells)) == sorted([j.track, j.repeat] for j in jobs)


def load_round0(run_dir: pathlib.Path) -> Evaluation:
    """The round-0 evaluation `save_round0` wrote in `run_dir`."""
    return Evaluation.from_dict(json.loads((pathlib.Path(run_dir) / ROUND0_FILE).read_text()))


def round0_items(run_dir: pathlib.Path) -> Mapping | None:
    """Round 0's rubric item counts (`ItemRates.to_dict()`), None when the run did not record them."""
    return json.loads((pathlib.Path(run_dir) / ROUND0_FILE).read_text()).get("items")

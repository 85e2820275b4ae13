"""SFT cold start (paper §3.2, Appendix A.1 / A.4): next-token loss on the single target response.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bat_jax.learn import grpo, objective
from bat_jax.learn.optim import OptimizerConfig


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """SFT cold-start settings (paper Appendix A.4; released code in brackets).

    Attributes:
      optimizer: AdamW wd 0, lr 2e-5, cosine, 3 % warmup, grad-norm clip 1.
      global_batch_size: sequences per optimizer step, 64 [32].
      num_micro_batches: gradient-accumulation steps per optimizer step (global batch / micro batches
        sequences per forward pass).
      total_steps: optimizer steps, 200.
      max_seq_len: tokens per sequence, 12,288 [8,192].
      checkpoint_every: save a checkpoint every N optimizer steps, 5.
    """

    optimizer: OptimizerConfig = OptimizerConfig()
    global_batch_size: int = 64
    num_micro_batches: int = 1
    total_steps: int = 200
    max_seq_len: int = 12288
    checkpoint_every: int = 5


def build_sft_example(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    end_of_turn_id: int,
    max_seq_len: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """One right-padded SFT sequence: prompt + response + end-of-turn.

    ``end_of_turn_id`` is appended unless ``response_ids`` already ends with it.

    Returns:
      ``{'input_ids': [T] int32, 'attention_mask': [T] int32, 'loss_mask': [T] int32}`` with T =
      ``max_seq_len``; ``loss_mask`` is 1 exactly on the response tokens and the end-of-turn token.
    Raises:
      ValueError: empty prompt or response, or prompt + response + end-of-turn longer than ``max_seq_len``
        (never silently truncated: a cut response would teach the model to stop mid-action).
    """
    prompt = [int(x) for x in prompt_ids]
    response = [int(x) for x in response_ids]
    if not prompt:
        raise ValueError("build_sft_example: empty prompt (the first token cannot carry loss)")
    if not response:
        raise ValueError("build_sft_example: empty response")
    if response[-1] != end_of_turn_id:
        response.append(int(end_of_turn_id))
    n = len(prompt) + len(response)
    if n > max_seq_len:
        raise ValueError(
            f"build_sft_example: prompt {len(prompt)} + response {len(response)} tokens = {n} > max_seq_len {max_seq_len}"
        )
    ids = np.full((max_seq_len,), pad_id, np.int32)
    ids[:n] = prompt + response
    attn = np.zeros((max_seq_len,), np.int32)
    attn[:n] = 1
    loss = np.zeros((max_seq_len,), np.int32)
    loss[len(prompt) : n] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def stack_examples(examples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack per-example dicts into a ``[B, T]`` batch."""
    if not examples:
        raise ValueError("stack_examples: no examples")
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def sft_token_nll(logits: jax.Array, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood ``[B, T] float32`` (0 off the loss mask) and the effective mask."""
    lp = grpo.shifted_token_logprobs(logits, batch["input_ids"])
    mask = objective.effective_loss_mask(batch["loss_mask"])
    return jnp.where(mask > 0, -lp, 0.0), mask


def make_sft_loss(
    apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array],
) -> Callable[[Any, Mapping[str, jax.Array], Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """Token-mean NLL over the response tokens for :func:`bat_jax.learn.train_state.make_train_step`.

    Log-probs come from :func:`bat_jax.learn.grpo.sequence_logprobs` (chunked output head for a
    ``ModelApply``), the same values as :func:`sft_token_nll` on full logits.

    Use :func:`sft_normalizers` as the step's ``normalizer_fn``. Metrics: ``nll`` (same as the loss) and
    ``num_tokens`` share (sums to the batch's loss-token count over micro-batches).
    """

    def loss_fn(params, batch, normalizers):
        lp = grpo.sequence_logprobs(apply_fn, params, batch["input_ids"], batch["attention_mask"])
        mask = objective.effective_loss_mask(batch["loss_mask"])
        nll = jnp.where(mask > 0, -lp, 0.0)
        loss = objective.aggregate_loss(nll, mask, "token-mean", normalizers)
        return loss, {"nll": loss, "num_tokens": mask.sum()}

    return loss_fn


def sft_normalizers(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Whole-batch loss-token count (and sequence count) from ``batch['loss_mask']``."""
    return objective.loss_normalizers(batch["loss_mask"])

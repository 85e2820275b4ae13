"""SFT data: Stage Bank SFT rows rendered in the policy's chat template and batched for the cold start.

Paper Eq. 9, Appendix A.4.

Details: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from bat_jax.learn.batching import pad_batch, sft_bucket
from bat_jax.learn.sft import build_sft_example
from bat_jax.models.chat import render_action
from bat_jax.models.episode import EpisodeBuilder
from bat_jax.policy import Policy
from bat_jax.prompts import PromptFormat
from bat_jax.rollout.agent_loop import cut_observation
from bat_jax.stage_bank.row import SFTRow


def render_sft_row(row: SFTRow, policy: Policy, prompt: PromptFormat, max_seq_len: int,
                   max_observation_chars: int | None = None, all_turns: bool = False) -> dict[str, np.ndarray] | None:
    """Tokenised SFT example of a Stage Bank SFT row in the policy's chat template.

    Rows are model-neutral; the adapter renders them. Context (system, user, prior assistant actions and tool
    observations) as the prompt, the one target action + `<|im_end|>` as the response (loss mask 1). With
    `max_observation_chars`, each tool observation is cut exactly as the agent loop cuts it at rollout time
    (`rollout.agent_loop.cut_observation`), so SFT contexts look like the contexts the policy acts in. The system prompt
    and first user turn are those of `prompt` (the policy's style in the benchmark's words; the teacher's system message
    is replaced). Only the template's own tags become control ids: the brief, skill, observations and the teacher's
    thoughts and arguments are ordinary text whatever they contain (`models.episode.TextCodec`).

    With `all_turns`, the context's earlier assistant actions (each + `<|im_end|>`) carry loss too: the row then
    trains every earlier row of its teacher trajectory at once, each action with exactly its own context
    (causal attention), as `trajectory_examples` uses it.

    Returns `{'input_ids','attention_mask','loss_mask'}` `[max_seq_len]` int32, or None when the row does not
    fit in `max_seq_len` tokens (never truncated: a cut action would teach the model to stop mid-call).
    """
    builder = EpisodeBuilder(policy.tokenizer, policy.chat_family)
    users = [m for m in row.context if m.role == "user"]
    if not users:
        raise ValueError(f"SFT row {row.row_id}: context has no user message")
    start = row.context.index(users[0]) + 1
    system, tools = prompt.head()
    builder.start([{"role": "system", "content": system}, {"role": "user", "content": prompt.styled(users[0].content)}],
                  tools=[dict(t) for t in tools])
    rest = row.context[start:]
    for message in rest:
        if message.role == "assistant":
            builder.add_assistant_text(render_action(message.action, policy.chat_family))
        else:
            builder.add_tool_response(message.content if max_observation_chars is None
                                      else cut_observation(message.content, max_observation_chars))
    context = builder.build()
    prompt_ids = context.ids.tolist()
    response = builder.encode(render_action(row.target, policy.chat_family))
    if len(prompt_ids) + len(response) + 1 > max_seq_len:
        return None
    example = build_sft_example(prompt_ids, response, builder.eot_id, max_seq_len)
    if all_turns:
        example["loss_mask"][: len(prompt_ids)] = context.loss_mask
    return example


def trajectory_key(row: SFTRow) -> tuple[str, int] | None:
    """(teacher trajectory digest, turn) of an SFT row, from its provenance's `sft_slice` step; None if absent."""
    for step in reversed(tuple(row.provenance.transformations)):
        if step.name == "sft_slice":
            return str(step.params["trajectory"]), int(step.params["turn"])
    return None


def trajectory_examples(rows: Sequence[SFTRow], policy: Policy, prompt: PromptFormat, max_seq_len: int,
                        max_observation_chars: int | None = None) -> list[dict[str, np.ndarray]]:
    """SFT examples with loss on every expert action.

    Per teacher trajectory (`trajectory_key`) only its latest-turn row that fits `max_seq_len`, rendered with
    `all_turns`, which holds the targets of all its earlier rows with their exact contexts; rows without an `sft_slice`
    step are rendered on their own. Examples as `render_sft_row`'s, in the order of the rows kept."""
    best: dict[str, tuple[int, dict]] = {}
    out: list[dict[str, np.ndarray]] = []
    for row in rows:
        key = trajectory_key(row)
        example = render_sft_row(row, policy, prompt, max_seq_len, max_observation_chars, all_turns=key is not None)
        if example is None:
            continue
        if key is None:
            out.append(example)
        elif key[0] not in best or key[1] > best[key[0]][0]:
            best[key[0]] = (key[1], example)
    return out + [example for _, example in best.values()]


def sft_batch(examples: Sequence[Mapping[str, np.ndarray]], batch_size: int, rng: np.random.Generator,
              max_seq_len: int) -> dict[str, np.ndarray]:
    """One SFT batch of rendered rows, padded only to the bucket of its longest row.

    The batch is `{'input_ids','attention_mask','loss_mask'}` `[batch_size, T]` int32; rows are `render_sft_row` output,
    `[max_seq_len]` each; the bucket is `sft_bucket`'s, so that a step on short rows does not pay for `max_seq_len`
    tokens.

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
    t = buckets[first]
    return pad_batch([{k: np.asarray(v)[:t] for k, v in examples[i].items()} for i in [first, *others]],
                     multiple=1, pad_to=t)

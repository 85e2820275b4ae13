"""The agent loop's doubles: a word tokenizer, a stub episode builder, scripted engines, a fake sandbox."""

import dataclasses

import numpy as np

from bat_jax.models.chat import render_action
from bat_jax.rollout.agent_loop import RolloutRequest
from bat_jax.rollout.engine import Completion
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, SandboxState

# --- the agent loop's doubles (test_agent_loop, test_run_loops, test_reward_integrity_inputs, ...) -------------

CALL = '<tool_call>\n{"name": "execute_code", "arguments": {"language": "bash", "code": "echo hi"}}\n</tool_call>'
SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {"path": "out.txt"}}\n</tool_call>'
EOT, IM_START = 2, 1


class WordTokenizer:
    """One token per whitespace-separated word; a few ids decode to whole tool calls."""

    def __init__(self):
        self.pieces = {EOT: "<|im_end|>", IM_START: "<|im_start|>", 10: CALL, 11: " ok", 12: SUBMIT}
        self.ids = {}

    def encode(self, text):
        out = []
        for word in text.split():
            if word not in self.ids:
                self.ids[word] = 100 + len(self.ids)
                self.pieces[self.ids[word]] = " " + word
            out.append(self.ids[word])
        return out

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


@dataclasses.dataclass
class StubEpisode:
    ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    template: object = None


class StubBuilder:
    """The `EpisodeBuilder` interface with exact token accounting: a tool response is exactly the
    observation's words; a truncated turn gets the end-of-turn token as mask-0 glue."""

    family = "qwen3"
    eot_id, im_start_id = EOT, IM_START

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids, self.mask, self.lps, self.msgs = [], [], [], []

    def start(self, messages, tools):
        self.msgs = list(messages)
        ids = self.tokenizer.encode(" ".join(m["content"] for m in messages))
        self.ids, self.mask, self.lps = list(ids), [0] * len(ids), [0.0] * len(ids)
        return ids

    def add_assistant(self, ids, logprobs, truncated=False):
        self.ids += ids
        self.mask += [1] * len(ids)
        self.lps += list(logprobs)
        if truncated:
            self.ids, self.mask, self.lps = self.ids + [EOT], self.mask + [0], self.lps + [0.0]
        self.msgs.append({"role": "assistant", "content": self.tokenizer.decode(ids)})

    def add_tool_response(self, text):
        ids = self.tokenizer.encode(text)
        self.ids, self.mask, self.lps = self.ids + ids, self.mask + [0] * len(ids), self.lps + [0.0] * len(ids)
        self.msgs.append({"role": "tool", "content": text})
        return ids

    def build(self):
        return StubEpisode(np.asarray(self.ids, np.int32), np.asarray(self.mask, np.int32),
                           np.asarray(self.lps, np.float32))

    def messages(self):
        return list(self.msgs)


class ScriptedEngine:
    """Replays scripted turns (ids) for every row, turn by turn; logprobs are -(turn + 1) / 10 - position / 100.
    `obey_budget=False` returns whole turns whatever the budget (an engine overshooting its limit)."""

    def __init__(self, turns, obey_budget=True):
        self.turns, self.obey_budget = turns, obey_budget
        self.calls = []
        self.weight_version = 3

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        self.calls.append(list(max_new_tokens))
        out = []
        for prompt, budget in zip(prompts, max_new_tokens):
            turn = sum(1 for t in prompt if t == EOT)  # turns so far = end-of-turn tokens in the prompt
            ids = list(self.turns[min(turn, len(self.turns) - 1)])
            lps = [-(turn + 1) / 10 - j / 100 for j in range(len(ids))]
            reason = "stop"
            if self.obey_budget and len(ids) > budget:
                ids, lps, reason = ids[:budget], lps[:budget], "length"
            out.append(Completion(np.asarray(ids, np.int32), np.asarray(lps, np.float32), reason, 3))
        return out


class FakeSandbox:
    """Echoes 'hi' for execute_code; `fail` makes execute_code raise (a backend failure)."""

    def __init__(self, state, fail=False):
        self.calls, self.fail, self._submitted = [], fail, None

    def execute_code(self, language, code, timeout_s=None):
        self.calls.append(code)
        if self.fail:
            raise ConnectionError("docker daemon went away")
        return Observation("hi\n", "", 0, 0.01)

    def submit(self, path):
        self._submitted = path
        return Observation(f"submitted {path}", "", 0, 0.0)

    def receipts(self):
        return [f"receipt {i}" for i in range(len(self.calls))]

    def submitted(self):
        return self._submitted

    def list_files(self):
        return []

    def read_file(self, path):
        raise FileNotFoundError(path)

    def close(self):
        pass


REQUEST = RolloutRequest(state_id="row-1", state=SandboxState(files={}), system_prompt="skill",
                         user_message="brief", stage="S3")
ACTION = [10, 11, 11, 11, 11, EOT]  # 6 tokens: a valid execute_code call + 4 filler tokens + end of turn


class RealCallEngine:
    """Writes one execute_code call in the real template's form every turn (the tiny tokenizer's ids)."""

    def __init__(self, builder):
        action = Action("", "execute_code", {"language": "python", "code": "print(chr(0xF0000) * 4096)"})
        self.turn = builder.encode(render_action(action, builder.family)) + [builder.eot_id]

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        return [Completion(np.asarray(self.turn[:b], np.int32), np.zeros(min(b, len(self.turn)), np.float32),
                           "stop", 0) for b in max_new_tokens]


def scripted_agent_loop(engine, config, sandbox_factory=FakeSandbox, **kw):
    """An `AgentLoop` over `engine` with the word tokenizer's stub builder (the agent loop's tests' loop)."""
    from bat_jax.rollout.agent_loop import AgentLoop

    tok = WordTokenizer()
    return AgentLoop(engine, lambda: StubBuilder(tok), sandbox_factory, config, extra_stop_ids=(IM_START,), **kw)

"""Schedules of the agent loop (rollout/schedule.py): 'continuous' gives the same trajectories as 'lockstep' on
fixed seeds (a seeded fake engine with real local sandboxes and the real chat template; slow: the JAX sampler),
a sandbox call of one episode overlaps the generation of another only under 'continuous', and the engine is
never asked for more than `max_generate_batch` rows. No wall-clock speed is asserted here (see
launch/bench/bench_rollout.py --loops)."""

import dataclasses
import threading

import numpy as np
import pytest

from bat_jax.models.chat import render_action
from bat_jax.rollout import trajectory as tj
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.rollout.engine import Completion
from bat_jax.sandbox.local import NullSandbox
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, SandboxState


def _same(a: tj.Trajectory, b: tj.Trajectory, logprob_atol: float = 0.0) -> None:
    """Two trajectories are the same record (receipt timestamps aside); logprobs within `logprob_atol`."""
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "receipts":
            strip = lambda r: dataclasses.replace(r, started_at=0.0, finished_at=0.0)  # noqa: E731
            x, y = tuple(map(strip, x)), tuple(map(strip, y))
        if field.name == "logprobs" and logprob_atol:
            np.testing.assert_allclose(x, y, rtol=0, atol=logprob_atol, err_msg=field.name)
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=field.name)
        else:
            assert x == y, field.name


class SeededEngine:
    """A fake policy whose turn is a function of the row's seed alone (the `RolloutEngine` contract): the seed
    picks one of `turns` (token ids) and the logprobs. Records the seeds of every call (one list per call)."""

    weight_version = 5

    def __init__(self, turns):
        self.turns = turns
        self.calls: list[list[int]] = []
        self.lock = threading.Lock()

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        with self.lock:
            self.calls.append(list(seeds))
        out = []
        for seed, budget in zip(seeds, max_new_tokens):
            rng = np.random.default_rng(seed)
            ids = list(self.turns[int(rng.integers(len(self.turns)))])[:budget]
            lps = rng.uniform(-3, 0, len(ids)).astype(np.float32)
            out.append(Completion(np.asarray(ids, np.int32), lps, "stop", self.weight_version))
        return out


def _tiny_turns(tok):
    """Rendered Qwen3.5 turns: writes with sleeps of different lengths (so tool calls finish out of order), a
    turn without a tool call (parse-error observation) and a submit."""
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    actions = [Action("w", "execute_code", {"language": "bash", "code": f"sleep 0.0{d}; echo {d} >> out.txt"})
               for d in (1, 5, 9)]
    actions.append(Action("s", "submit", {"path": "out.txt"}))
    turns = [tok.encode(render_action(a, "qwen3_5"), add_special_tokens=False) + [eot] for a in actions]
    return turns + [tok.encode("no tool call here", add_special_tokens=False) + [eot]]


def _requests(n):
    return [RolloutRequest(state_id=f"row-{i}", state=SandboxState(files={"in.txt": b"x"}), system_prompt="skill",
                           user_message=f"brief {i}", stage="E2E") for i in range(n)]


def test_continuous_matches_lockstep_on_local_sandboxes():
    """3 rows x K=3 in LocalSandbox (real subprocesses, out-of-order sleeps), a seeded fake engine: the two
    schedules give identical trajectories, ids and logprobs bit for bit, receipts, artefacts, finish reasons."""
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.sandbox.local import LocalSandbox

    tok = load_tiny_tokenizer()
    turns = _tiny_turns(tok)
    out, engines = {}, {}
    for schedule, concurrent in (("lockstep", 1), ("continuous", 1), ("continuous", 3)):
        engines[schedule, concurrent] = engine = SeededEngine(turns)
        config = AgentLoopConfig(sampling=SamplingConfig(group_size=3),
                                 max_assistant_turns=6, max_workers=4, progress=False,
                                 schedule=schedule, max_generate_batch=4, max_concurrent_generate=concurrent)
        loop = AgentLoop(engine, lambda: EpisodeBuilder(tok, "qwen3_5"), LocalSandbox, config)
        out[schedule, concurrent] = loop.run(_requests(3), seed=11)
    engines["lockstep"], engines["continuous"] = engines["lockstep", 1], engines["continuous", 1]
    out["lockstep"] = out["lockstep", 1]
    assert [(t.state_id, t.episode) for t in out["continuous", 3]] == [(f"row-{i}", k) for i in range(3)
                                                                      for k in range(3)]
    for a, b, c in zip(out["lockstep"], out["continuous", 1], out["continuous", 3]):
        _same(a, b)
        _same(a, c)
    reasons = {t.finish_reason for t in out["lockstep"]}
    assert reasons <= {tj.FINISH_SUBMITTED, tj.FINISH_MAX_TURNS} and len(reasons) == 2  # both kinds of end
    assert sum(t.num_tool_calls for t in out["lockstep"]) >= 9
    # the same generations were asked for (seeds are per episode and turn), in different batches
    assert sorted(sum(engines["lockstep"].calls, [])) == sorted(sum(engines["continuous"].calls, []))
    assert sorted(sum(engines["lockstep"].calls, [])) == sorted(sum(engines["continuous", 3].calls, []))
    assert max(map(len, engines["lockstep"].calls)) == 9  # lockstep: every live episode in one call
    assert max(map(len, engines["continuous"].calls)) <= 4  # continuous: at most max_generate_batch


ACTION = '<tool_call>\n{"name": "execute_code", "arguments": {"language": "bash", "code": "slow"}}\n</tool_call>'


class EventTokenizer:
    """Ids 1 (end of turn), 10 (the tool call above) and one id per new word of a prompt."""

    def __init__(self):
        self.words: dict[str, int] = {}

    def encode(self, text):
        return [self.words.setdefault(w, 100 + len(self.words)) for w in text.split()]

    def decode(self, ids):
        return "".join({1: "<|im_end|>", 10: ACTION}.get(i, f" w{i}") for i in ids)


class EventBuilder:
    """Minimal `EpisodeBuilder`: the episode's request index is the prompt's first id minus 100 ('brief i')."""

    family, eot_id = "qwen3", 1

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.mask, self.lps = tokenizer, [], [], []

    def start(self, messages, tools):
        self.ids = self.tokenizer.encode(messages[1]["content"])
        self.mask, self.lps = [0] * len(self.ids), [0.0] * len(self.ids)
        return self.ids

    def add_assistant(self, ids, logprobs, truncated=False):
        self.ids, self.mask, self.lps = self.ids + list(ids), self.mask + [1] * len(ids), self.lps + list(logprobs)

    def add_tool_response(self, text):
        self.ids, self.mask, self.lps = self.ids + [3], self.mask + [0], self.lps + [0.0]

    def build(self):
        @dataclasses.dataclass
        class Built:
            ids: np.ndarray
            loss_mask: np.ndarray
            logprobs: np.ndarray
            template: object = None

        return Built(np.asarray(self.ids, np.int32), np.asarray(self.mask, np.int32), np.asarray(self.lps, np.float32))

    def messages(self):
        return []


def test_tool_call_of_one_episode_overlaps_generation_of_another():
    """Episode 0's first tool call blocks until the engine generates a turn for episode 1 after episode 1's own
    first tool call (its second turn). Under 'continuous' that happens while episode 0's call is still running;
    under 'lockstep' episode 1's second turn waits for episode 0's call, so the wait times out (0.5 s; the
    outcome is recorded, not the time). Event order, not wall-clock speed, is asserted."""
    tok = EventTokenizer()
    requests = [dataclasses.replace(r, user_message=f"brief{i}", state=SandboxState(files={"who": str(i).encode()}))
                for i, r in enumerate(_requests(2))]
    ep_of_first_id = {tok.encode(f"brief{i}")[0]: i for i in range(2)}

    for schedule, overlapped in (("continuous", True), ("lockstep", False)):
        second_turn_of_1 = threading.Event()
        events: list[str] = []

        class Engine:
            weight_version = 0

            def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
                eps = [(ep_of_first_id[p[0]], sum(1 for t in p if t == 1)) for p in prompts]  # (episode, turn)
                events.append(f"generate {sorted(eps)}")
                if (1, 1) in eps:
                    second_turn_of_1.set()
                return [Completion(np.asarray([10, 1], np.int32), np.zeros(2, np.float32), "stop")
                        for _ in prompts]

        class Sandbox(NullSandbox):
            def __init__(self, state):
                self.calls = 0

            def execute_code(self, language, code, timeout_s=None):
                self.calls += 1
                if self.is_zero and self.calls == 1:
                    events.append(f"episode 0 call waits; overlapped={second_turn_of_1.wait(timeout=0.5)}")
                return Observation("ok", "", 0, 0.0)

        def factory(state):
            sb = Sandbox(state)
            sb.is_zero = state.files["who"] == b"0"
            return sb

        config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                                 max_assistant_turns=2, max_workers=2, progress=False,
                                 schedule=schedule)
        loop = AgentLoop(Engine(), lambda: EventBuilder(tok), factory, config)
        trajs = loop.run(requests, seed=0)
        assert [t.finish_reason for t in trajs] == [tj.FINISH_MAX_TURNS] * 2
        assert f"episode 0 call waits; overlapped={overlapped}" in events, events
        if overlapped:  # episode 1's second turn was generated alone while episode 0's call ran
            assert events.index("generate [(1, 1)]") < events.index("episode 0 call waits; overlapped=True")
        else:
            assert events[0] == "generate [(0, 0), (1, 0)]" and "generate [(0, 1), (1, 1)]" in events


def test_an_ended_episode_is_handed_on_while_others_run():
    """`on_trajectory` (the hook reward scoring uses) gets an episode's trajectory as soon as it ends: episode 0's
    first tool call blocks until episode 1's trajectory has been handed over. Under 'continuous' episode 1 ends
    (two turns) during that call; under 'lockstep' every hand-over comes after the batch, so the wait times out
    (0.5 s; the outcome is recorded, not the time). The positions index the returned list, and the objects
    handed over are the ones returned."""
    tok = EventTokenizer()
    requests = [dataclasses.replace(r, user_message=f"brief{i}", state=SandboxState(files={"who": str(i).encode()}))
                for i, r in enumerate(_requests(2))]

    class Engine:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            return [Completion(np.asarray([10, 1], np.int32), np.zeros(2, np.float32), "stop") for _ in prompts]

    for schedule, overlapped in (("continuous", True), ("lockstep", False)):
        one_handed_on = threading.Event()
        handed: dict[int, tj.Trajectory] = {}
        waited: list[bool] = []

        class Sandbox(NullSandbox):
            def __init__(self, state):
                self.who, self.calls = state.files["who"], 0

            def execute_code(self, language, code, timeout_s=None):
                self.calls += 1
                if self.who == b"0" and self.calls == 1:
                    waited.append(one_handed_on.wait(timeout=0.5))
                return Observation("ok", "", 0, 0.0)

        def on_trajectory(position, trajectory):
            assert threading.current_thread() is threading.main_thread()  # the loop's own thread
            handed[position] = trajectory
            if position == 1:
                one_handed_on.set()

        config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                                 max_assistant_turns=2, max_workers=2, progress=False,
                                 schedule=schedule)
        trajs = AgentLoop(Engine(), lambda: EventBuilder(tok), Sandbox, config).run(requests, seed=0,
                                                                                   on_trajectory=on_trajectory)
        assert waited == [overlapped], schedule
        assert sorted(handed) == [0, 1] and all(handed[i] is trajs[i] for i in range(2))
        assert [t.state_id for t in trajs] == ["row-0", "row-1"]


def test_schedule_config_errors_name_the_field():
    with pytest.raises(ValueError, match="AgentLoopConfig.schedule"):
        AgentLoopConfig(schedule="async")
    with pytest.raises(ValueError, match="AgentLoopConfig.max_generate_batch"):
        AgentLoopConfig(max_generate_batch=0)
    with pytest.raises(ValueError, match="AgentLoopConfig.max_workers must be >= 0, got -1"):
        AgentLoopConfig(max_workers=-1)


@pytest.mark.parametrize("schedule", ["continuous", "lockstep"])
def test_every_episode_gets_its_own_sandbox_thread_by_default(schedule):
    """Default `max_workers` (0): one thread per episode, so 8 sandboxes open at once — each creation waits (up
    to 5 s) for all 8 to be in progress. With 4 threads the other 4 creations never start in time, the first 4
    give up (0.5 s) and break the barrier for the rest: every rollout is unscored (`infra_error`)."""
    assert (AgentLoopConfig().workers(32), AgentLoopConfig(max_workers=4).workers(32)) == (32, 4)
    tok = EventTokenizer()
    requests = [dataclasses.replace(r, user_message=f"brief{i}") for i, r in enumerate(_requests(8))]

    class Engine:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            return [Completion(np.asarray([1], np.int32), np.zeros(1, np.float32), "stop") for _ in prompts]

    for workers, unscored in ((0, 0), (4, 8)):
        all_in = threading.Barrier(8, timeout=5 if workers == 0 else 0.5)

        def factory(state):
            all_in.wait()  # raises BrokenBarrierError when not all 8 are being created together
            return NullSandbox(state)

        config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                                 max_assistant_turns=1, max_workers=workers, progress=False,
                                 schedule=schedule)
        trajs = AgentLoop(Engine(), lambda: EventBuilder(tok), factory, config).run(requests, seed=0)
        assert sum(bool(t.infra_error) for t in trajs) == unscored, (workers, [t.infra_error for t in trajs])


@pytest.mark.slow
def test_continuous_matches_lockstep_with_the_jax_sampler():
    """A tiny random Qwen3.5 through both schedules: sampled ids, loss masks, messages and finish reasons are
    identical; logprobs agree to float32 round-off (the sampler pads each call's batch, so a row's logits can
    differ in the last bits between batch compositions; measured <= 2e-6)."""
    from flax import nnx

    from bat_jax.models.configs import Qwen3_5Config
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE, load_tiny_tokenizer
    from bat_jax.rollout.jax_sampler import JaxSampler
    from bat_jax.sandbox.local import LocalSandbox

    tok = load_tiny_tokenizer()
    cfg = Qwen3_5Config(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                        linear_num_value_heads=4)
    sampler = JaxSampler(Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    out = {}
    for schedule in ("lockstep", "continuous"):
        config = AgentLoopConfig(sampling=SamplingConfig(group_size=3), max_assistant_turns=3, max_tokens_per_turn=8,
                                 progress=False, schedule=schedule, max_generate_batch=2)
        loop = AgentLoop(sampler, lambda: EpisodeBuilder(tok, "qwen3_5"), LocalSandbox, config,
                         extra_stop_ids=(im_start,))
        out[schedule] = loop.run(_requests(2), seed=3)
    for a, b in zip(out["lockstep"], out["continuous"]):
        _same(a, b, logprob_atol=1e-5)
    assert out["lockstep"][0].ids.tolist() != out["lockstep"][1].ids.tolist()


@pytest.mark.parametrize("concurrent", [1, 2])
def test_max_concurrent_generate_calls_in_flight(concurrent):
    """2 episodes, one row per call (`max_generate_batch=1`): each engine call waits (up to 0.5 s) for a second
    call to be in flight. With `max_concurrent_generate=2` the first turns of both episodes meet; with 1 they
    cannot (outcomes recorded, not times)."""
    met = []
    barrier = threading.Barrier(2)

    class Engine:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            try:
                barrier.wait(timeout=0.5)
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            return [Completion(np.asarray([10, 1], np.int32), np.zeros(2, np.float32), "stop") for _ in prompts]

    tok = EventTokenizer()
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=2),
                             max_assistant_turns=1, progress=False, max_generate_batch=1,
                             max_concurrent_generate=concurrent)
    trajs = AgentLoop(Engine(), lambda: EventBuilder(tok), NullSandbox, config).run(_requests(1), seed=0)
    assert [t.finish_reason for t in trajs] == [tj.FINISH_MAX_TURNS] * 2
    assert met == ([True, True] if concurrent == 2 else [False, False])

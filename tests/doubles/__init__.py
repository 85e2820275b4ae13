"""Test doubles and builders that several test files share (no test file imports another).

One module per role, each section naming the tests that use it: `rows` (stand-in rows and banks, example rows, a
micro policy config, factory builds), `models` (tiny models), `agent_loop` (the agent loop's scripted tokenizer /
episode builder / engine / sandbox), `judges` (judge endpoints and evidence), `judge_server` (a local HTTP judge), `processes` (a started JAX process's environment) and `grpo` (reward rows and
trajectories, the GRPO block's learner and scorer stand-ins). Every name is re-exported here, so tests import
`from doubles import X`.
"""

from .rows import (EXAMPLE_STATE, H, MICRO_POLICY, OUTCOMES, TINY_BANK_ROWS_PER_FOCUS, TRACKS,
                   assert_rounds_fit_the_tiny_bank, crashing_build, example_provenance, example_rl_row, example_sft_row,
                   fake_build, make_bank, make_rows, slow_build, tabular_micro_bindings)
from .models import (SAMPLER_KW, TINY, VLLM_TINY, lora_reference_models, reference_logprobs, reference_logits,
                     set_random_adapter, tiny_model, vllm_reference_model)
from .agent_loop import (ACTION, CALL, EOT, IM_START, REQUEST, SUBMIT, FakeSandbox, RealCallEngine, ScriptedEngine,
                         StubBuilder, StubEpisode, WordTokenizer, scripted_agent_loop)
from .judges import (EVIDENCE_BLOCK, FORGED_BRIEF, JUDGED_SEED, JUDGED_TEMPLATE, JUDGED_VARIANT, ScriptedJudge,
                     decode_judge_request, judge_config, judged_row, judged_trajectory, reply_styles, rubric_judge,
                     tamper, traced_receipt)
from .judge_server import JudgeServer, approx_tokens
from .processes import cpu_process_env
from .grpo import (FakeLearner, failed_trajectory, patch_rollout_scoring, reward_row, reward_trajectory)

__all__ = ['cpu_process_env', 'EXAMPLE_STATE', 'H', 'MICRO_POLICY', 'OUTCOMES', 'TINY_BANK_ROWS_PER_FOCUS', 'TRACKS',
           'assert_rounds_fit_the_tiny_bank', 'crashing_build', 'example_provenance', 'example_rl_row',
           'example_sft_row', 'fake_build', 'make_bank', 'make_rows', 'slow_build', 'tabular_micro_bindings', 'SAMPLER_KW', 'TINY', 'VLLM_TINY',
           'tiny_model', 'vllm_reference_model', 'lora_reference_models', 'reference_logprobs', 'reference_logits',
           'set_random_adapter', 'ACTION', 'CALL', 'EOT', 'IM_START', 'REQUEST', 'SUBMIT',
           'FakeSandbox', 'RealCallEngine', 'ScriptedEngine', 'StubBuilder', 'StubEpisode', 'WordTokenizer',
           'scripted_agent_loop', 'EVIDENCE_BLOCK', 'FORGED_BRIEF', 'JUDGED_SEED', 'JUDGED_TEMPLATE', 'JUDGED_VARIANT',
           'ScriptedJudge', 'decode_judge_request', 'judge_config', 'judged_row', 'judged_trajectory', 'reply_styles',
           'rubric_judge', 'tamper', 'traced_receipt', 'JudgeServer', 'approx_tokens', 'FakeLearner', 'failed_trajectory', 'patch_rollout_scoring',
           'reward_row', 'reward_trajectory']

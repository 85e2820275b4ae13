"""BiCuRL, the composition layer: the experiment and the jobs that wire the mechanisms below into one run.

Modules:
- experiment: the outer loop, top to bottom; baselines.
- reward: GRPO rollouts → rubric rewards.
- evaluation: the held-out suite, its cell runners, the external adapter.
- engines: the rollout engine of a run.
- run_loops: engine + sandboxes + agent loops of one run.
- ray_workers: rollouts on Ray workers.
- sft_data: SFT rows → tokenised batches.
- evaluate_only: the evaluate-only job.
- export: the retained policy as an HF checkpoint.
Nothing below this package imports it.
"""

"""Task families (seven tracks), the episode interface, scripted/LLM teachers and the held-out suite.

Modules: layout (workspace paths), brief (task.md + stage skills κ), base (TaskInstance, Track,
variants/faults), metrics, rubric_items (per-stage rubric + evidence), episode (Conversation, Policy, Episode,
evidence; the loop itself is `bat_jax.rollout.action_loop`), teacher (ScriptedExpert, ChatTeacher, baselines),
harness (play, stage-start states, teacher trajectories with boundary
states, backend factory), heldout (suite + manifest), registry, and one module per track: classification,
detection, enhancement, report_generation, segmentation, synthesis, vqa.
"""

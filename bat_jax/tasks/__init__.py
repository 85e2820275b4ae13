"""Task families (seven tracks), the action-level episode interface, scripted/LLM teachers and the held-out suite.

Modules: layout (workspace paths), brief (task.md + stage skills κ), base (TaskInstance, Track, variants/faults),
metrics, method_replay (host-side replay of a task's method), rubric_items (per-stage rubric + evidence), episode
(Conversation, ActionPolicy, RecordedEpisode, host-side evidence and `score_episode`; the loop itself is
`bat_jax.rollout.action_loop`, playing one task `bat_jax.rollout.play`), teacher (ScriptedExpert, ChatTeacher,
baselines), portable_expert, heldout (suite + manifest), registry, and one module per track: classification,
detection, enhancement, report_generation, segmentation, synthesis, vqa.
"""

"""Task families (seven tracks), the episode interface, scripted/LLM teachers and the held-out suite.

Modules: base (layout, TaskInstance, Track, variants/faults), brief (task.md + stage skills κ), metrics,
rubric_items (per-stage rubric + evidence), episode (Action/Conversation/Policy/run_episode), teacher
(ScriptedExpert, OpenAITeacher, baselines), chat_client (OpenAI-compatible HTTP), harness (play, teacher
trajectories with boundary states, backend factory), heldout (suite + manifest), registry, and one module
per track: classification, detection, enhancement, report_generation, segmentation, synthesis, vqa.
"""

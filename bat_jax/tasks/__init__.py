"""Task families (seven tracks), the episode interface, scripted/LLM teachers and the held-out suite.

Modules: layout (workspace paths), brief (task.md + stage skills κ), base (TaskInstance, Track,
variants/faults), metrics, rubric_items (per-stage rubric + evidence), episode (Action/Conversation/Policy/
run_episode), teacher (ScriptedExpert, OpenAITeacher, baselines), chat_client (OpenAI-compatible HTTP), harness
(play, teacher trajectories with boundary states, backend factory), heldout (suite + manifest), registry, and
one module per track: classification, detection, enhancement, report_generation, segmentation, synthesis, vqa.
"""

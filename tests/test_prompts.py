"""The agent's prompts (bat_jax/prompts.py): the compact style's size and what its first user turn keeps, the full
style's text, and the refused style names."""

import pytest

from bat_jax.policy import PolicyConfig, build_policy
from bat_jax.prompts import PromptFormat
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from doubles import MICRO_POLICY as MICRO

IMAGING = ImagingBenchmark()


def _e2e_prompt_tokens(style: str) -> int:
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.benchmarks.imaging.heldout import heldout_suite

    policy = build_policy(PolicyConfig(tiny=MICRO, prompt_style=style))
    task = heldout_suite(1, ("recovery",), tracks=["segmentation"])[0]
    prompt = PromptFormat.of(IMAGING, style)
    return len(EpisodeBuilder(policy.tokenizer, policy.chat_family).start(*prompt.first_messages(task.brief,
                                                                                            IMAGING.row_skill("E2E"))))


def test_compact_prompt_is_a_fifth_of_the_full_one():
    full, compact = _e2e_prompt_tokens("full"), _e2e_prompt_tokens("compact")
    assert full > 1500 and compact < 400 and full / compact > 4.5, (full, compact)


def test_compact_user_message_keeps_every_path_id_and_the_start_stage():
    from bat_jax.benchmarks.imaging.heldout import heldout_suite

    row_prompt, row_skill = IMAGING.row_prompt, IMAGING.row_skill
    full, compact = PromptFormat.of(IMAGING, "full"), PromptFormat.of(IMAGING, "compact")
    task = heldout_suite(1, ("recovery",), tracks=["segmentation"])[0]
    L = task.layout
    text = compact.user_message(row_prompt(task, "S3"), row_skill("S3"))
    for needle in (task.task_id, L.cases_csv, L.images_dir, L.archive_dir, f"{L.method_dir}/model.py", L.plan_path,
                   L.env_json, L.validation_json, L.validation_dir, L.pred_dir, L.submission, "4 cases",
                   "Start: S3 Validate (done: S1 Plan, S2 Setup)", "S3 Validate: check every input"):
        assert needle in text, needle
    assert "S1 Plan:" not in text and "## Workflow" not in text
    assert full.user_message(row_prompt(task, "S3"), row_skill("S3")) == f"{row_prompt(task, 'S3')}\n\n" \
                                                                       f"## Stage skill\n{row_skill('S3')}"
    assert compact.user_message("# An external brief", "Do it.") == "# An external brief\n\n## Stage skill\nDo it."
    with pytest.raises(ValueError, match="prompt style"):
        PromptFormat.of(IMAGING, "terse")
    with pytest.raises(ValueError, match="prompt_style"):
        PolicyConfig(prompt_style="terse")

"""Public task text of the imaging suite (bat_jax/benchmarks/imaging/brief.py): template wordings, stage skills and
the compact first user turn, which leaves a brief from elsewhere unchanged."""

import pytest

from bat_jax.benchmarks.imaging.brief import (HELDOUT_TEMPLATE, N_TEMPLATES, SKILL_HEADING, VARIED_TEMPLATES,
                                              compact_skill, compact_user_message, stage_skill, wording)


def test_templates_map_to_their_wording_and_the_held_out_one_is_never_varied():
    assert (N_TEMPLATES, HELDOUT_TEMPLATE, VARIED_TEMPLATES) == (3, 2, (10, 11))
    assert [wording(t) for t in (0, 1, 2, 10, 11)] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match=r"template must be in 0..2 or one of \(10, 11\), got 12"):
        wording(12)


def test_stage_skills_by_id_or_title():
    assert compact_skill("S5") == compact_skill("Submit") == (
        "S5 Submit: write the submission (task id, predictions, failed) and submit it.")
    assert stage_skill("validate") == stage_skill("S3") and len(stage_skill("S3")) > len(compact_skill("S3"))


def test_a_first_turn_that_is_not_the_suites_is_returned_unchanged():
    text = "# An external brief\n\nCount the rows." + SKILL_HEADING + "Do it."
    assert compact_user_message(text) == text

"""The policy (bat_jax/policy.py): a tiny model built from its config with the shipped tokenizer and the chat family
its template needs."""

from bat_jax.policy import PolicyConfig, build_policy
from doubles import MICRO_POLICY as MICRO


def test_the_tiny_qwen3_policy_renders_with_the_shipped_tokenizers_template():
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.qwen3 import Qwen3ForCausalLM

    dense = {k: v for k, v in MICRO.items() if not k.startswith("linear_")}
    qwen3 = build_policy(PolicyConfig(architecture="qwen3", tiny=dense))
    assert isinstance(qwen3.model, Qwen3ForCausalLM) and qwen3.chat_family == "qwen3_5"
    builder = EpisodeBuilder(qwen3.tokenizer, qwen3.chat_family)  # family 'qwen3' would not match the template
    builder.start([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    from bat_jax.models.chat import get_family

    assert qwen3.tokenizer.decode(builder.build().ids.tolist()).endswith(get_family("qwen3_5").generation_prompt)

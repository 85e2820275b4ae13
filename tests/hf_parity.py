"""The transformers-parity scaffolding the model tests share (test_qwen3.py, test_qwen3_5.py, test_llama.py).

A random tiny torch model (norm weights randomised, since HF initialises them to a constant), saved and loaded
back through `hf_io`; left-padded batches; the torch reference logits; our full forward and our prefill +
token-by-token decode, jitted over the split model state. The tolerances stay in the tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from bat_jax.models import hf_io


def jit(fn):
    """jax.jit over the split model state (cheap per call, one compile per shape)."""
    return jax.jit(lambda graphdef, state, *args: fn(nnx.merge(graphdef, state), *args), static_argnums=0)


def randomise_norms(model):
    """Adds 0.1 · N(0, 1) to every ``*norm.weight`` of a torch model (in place, torch's global RNG); returns it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_and_load(torch_model, directory, **load_kwargs):
    """Saves a torch model as an HF checkpoint in `directory` and loads it back as our model."""
    torch_model.save_pretrained(directory)
    return hf_io.load_pretrained(directory, **load_kwargs)


def batch(vocab_size, seq, pads, seed):
    """(ids, mask), int32 [len(pads), seq]: random ids, row r left-padded with pads[r] zeros (mask 0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(len(pads), seq)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, p in enumerate(pads):
        mask[row, :p] = 0
        ids[row, :p] = 0
    return ids, mask


def positions(mask):
    """Position ids of a left-padded batch: 0 at each row's first real token (and on the padding)."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def torch_logits(torch_model, ids, mask):
    """The reference: the torch model's logits with the mask and the left-padded position ids."""
    with torch.no_grad():
        return torch_model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                           position_ids=torch.tensor(positions(mask), dtype=torch.long)).logits.numpy()


def forward(model, ids, mask, **kwargs):
    """Our model's logits of one full (jitted) forward; `kwargs` go to the call."""
    return np.asarray(jit(lambda m, i, a: m(i, a, **kwargs))(*nnx.split(model), jnp.asarray(ids), jnp.asarray(mask)))


def decode(model, ids, mask, prompt, max_len):
    """Prefill of the first `prompt` tokens, then one decode step per remaining token: (the logits of every
    position, [batch, seq, vocab], as one array; the final cache)."""
    graphdef, state = nnx.split(model)
    cache = model.init_cache(batch=ids.shape[0], max_len=max_len)
    logits, cache = jit(lambda m, i, a, c: m.prefill(i, a, c))(
        graphdef, state, jnp.asarray(ids[:, :prompt]), jnp.asarray(mask[:, :prompt]), cache)
    got = [np.asarray(logits)]
    step = jit(lambda m, tok, c: m.decode_step(tok, c))
    for t in range(prompt, ids.shape[1]):
        logits, cache = step(graphdef, state, jnp.asarray(ids[:, t]), cache)
        got.append(np.asarray(logits)[:, None])
    return np.concatenate(got, axis=1), cache

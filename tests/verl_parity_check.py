"""bat_jax's GRPO objective against verl's own functions, imported from a verl source tree, in a process of its own.

Run by tests/test_verl_parity.py (``BAT_JAX_VERL_SRC`` names the tree: a verl checkout's root); prints one JSON line
(the last line of stdout) of the largest differences, which the test asserts on. verl's packages this machine lacks
(tensordict, omegaconf, ray, ...) are stand-ins: only the functions below run, and none of them touches those.

Compared, in float64 on verl's side and float32 on ours, on random batches with extreme log ratios, an empty row and
unequal row lengths:

* ``core_algos.compute_policy_loss_vanilla`` (+ ``agg_loss`` with the whole batch's ``global_batch_info``, summed over
  two micro-batches) + β · ``kl_penalty(.., 'low_var_kl')`` against the GRPO loss with ``seq_mean_rows='all'``, dual
  clip 3, clip-higher, Dr.GRPO's C given: the value and the gradient with respect to the learner's logprobs, per
  ``loss_agg_mode``. verl before February 2026 returned ``seq-mean-token-sum-norm`` summed over rows: the factor
  is reported, the rest compared.
* ``core_algos.compute_grpo_outcome_advantage`` against ``grpo.group_advantages`` with
  ``singleton_advantage='reward'`` (groups of 1, 2 and 4, with and without std normalisation).
* ``rollout_corr_helper.compute_rollout_correction_weights(.., 'token')`` (TIS) and
  ``compute_rollout_rejection_mask(.., 'seq_mean_k1', 'lo_hi')`` against ``rollout_correction.correct`` with the
  ``'seq_mean_k1'`` convention (rows within 1e-6 of a bound left out: there the two sides' rounding decides).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bat_jax.learn import grpo, objective, rollout_correction  # noqa: E402


# verl imports these at module level; none is needed by the functions compared (ray is replaced even when installed:
# verl probes its accelerator managers at import)
STAND_INS = ("tensordict", "omegaconf", "ray", "hydra", "codetiming", "torchdata", "transfer_queue", "peft", "wandb",
             "datasets", "liger_kernel", "flash_attn", "pylatexenc", "mathruler", "math_verify", "qwen_vl_utils",
             "pybind11", "tensorboard", "uvicorn", "fastapi", "pyarrow", "torchvision")


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The packages of `STAND_INS` (first on ``sys.meta_path``) become MagicMock packages."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module):
        pass


def load_verl(root: str):
    sys.path.insert(0, root)
    sys.meta_path.insert(0, _StandIn())
    import transformers

    for name in ("AutoModelForVision2Seq",):  # removed in transformers 5; older verl imports it
        if not hasattr(transformers, name):
            setattr(transformers, name, mock.MagicMock(name=name))
    import verl.trainer.ppo.core_algos as core_algos
    import verl.trainer.ppo.rollout_corr_helper as rc
    return core_algos, rc


class ActorConfig(dict):
    """What ``compute_policy_loss_vanilla`` reads of verl's ActorConfig."""

    def __getattr__(self, key):
        return self[key]


def batch(rng, b=6, t=9):
    mask = np.zeros((b, t), np.float32)
    for row, (lo, hi) in enumerate([(1, 4), (2, 9), (3, 6), (1, 2), (0, 0), (4, 8)][:b]):
        mask[row, lo:hi] = 1  # row 4: empty (an unscored rollout)
    lp = rng.normal(-1.5, 1.0, (b, t)).astype(np.float32)
    old = (lp + rng.normal(0.0, 0.4, (b, t))).astype(np.float32)
    old[1, 2:8] = lp[1, 2:8] - np.array([-30, -5, -1.2, 1.2, 5, 30], np.float32)  # extreme ratios
    ref = (lp + rng.normal(0.0, 2.0, (b, t))).astype(np.float32)  # some k3 values clamp
    adv = np.array([1.0, -0.7, 0.3, -1.2, 0.5, 0.9], np.float32)[:b]
    return mask, lp, old, ref, adv


def policy_loss(ca, mode: str) -> dict[str, float]:
    rng = np.random.default_rng(0)
    mask, lp, old, ref, adv = batch(rng)
    beta, c_norm = 0.05, 7.0
    cfg = grpo.GRPOConfig(loss_agg=mode, kl_coef=beta, clip_eps_high=0.28, dual_clip=3.0, loss_scale_factor=c_norm)
    rows = np.arange(len(adv))
    jbatch = {"loss_mask": jnp.asarray(mask, jnp.int32), "attention_mask": jnp.ones(mask.shape, jnp.int32),
              "old_logprobs": jnp.asarray(old), "ref_logprobs": jnp.asarray(ref), "advantages": jnp.asarray(adv)}
    norms = grpo.grpo_normalizers(jbatch)

    def ours(x):
        t = grpo.grpo_token_terms(x, jbatch, cfg)
        return objective.aggregate_loss(t["total"], t["mask"], mode, norms, c_norm, cfg.seq_mean_rows)

    value, grad = jax.value_and_grad(ours)(jnp.asarray(lp))
    m = torch.tensor(np.asarray(objective.effective_loss_mask(jnp.asarray(mask))), dtype=torch.float64)
    info = {"dp_size": 1, "batch_num_tokens": float(m.sum()), "global_batch_size": len(rows),
            "loss_scale_factor": c_norm}
    conf = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                       global_batch_info=info)
    x = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    total = 0.0
    for part in (rows[::2], rows[1::2]):  # two micro-batches, whole-batch denominators
        a = torch.tensor(adv[part], dtype=torch.float64)[:, None].expand(-1, mask.shape[1])
        pg, _ = ca.compute_policy_loss_vanilla(torch.tensor(old[part], dtype=torch.float64), x[part], a, m[part],
                                               loss_agg_mode=mode, config=conf)
        kld = ca.kl_penalty(x[part], torch.tensor(ref[part], dtype=torch.float64), "low_var_kl")
        total = total + pg + beta * ca.agg_loss(kld, m[part], mode, **info)
    total.backward()
    probe = float(ca.agg_loss(torch.ones(1, 1), torch.ones(1, 1), "seq-mean-token-sum-norm", global_batch_size=2,
                              loss_scale_factor=1.0))
    factor = len(rows) if mode == "seq-mean-token-sum-norm" and probe == 1.0 else 1.0  # verl's sum over rows
    theirs, theirs_grad = float(total) / factor, x.grad.numpy() / factor
    scale = float(np.abs(theirs_grad).max())
    return {"value_rel": abs(float(value) - theirs) / abs(theirs), "verl_factor": float(factor),
            "grad_rel": float(np.abs(np.asarray(grad, np.float64) - theirs_grad).max() / scale)}


def advantages(ca) -> dict[str, float]:
    rng = np.random.default_rng(1)
    groups = ["a"] + ["b"] * 2 + ["c"] * 4 + ["d"] + ["e"] * 4
    rewards = rng.random(len(groups))
    rewards[-4:] = 0.25  # a group without variance
    worst = 0.0
    for std in (True, False):
        ours, _ = grpo.group_advantages(list(rewards), groups, grpo.GRPOConfig(singleton_advantage="reward",
                                                                                adv_std_normalize=std))
        token_rewards = torch.zeros(len(groups), 3, dtype=torch.float64)
        token_rewards[:, -1] = torch.tensor(rewards)
        theirs, _ = ca.compute_grpo_outcome_advantage(token_rewards, torch.ones(len(groups), 3),
                                                       np.array(groups, dtype=object), norm_adv_by_std_in_grpo=std)
        worst = max(worst, float(np.abs(ours - theirs[:, 0].numpy()).max()))
    return {"abs": worst}


def rollout_corr(rc) -> dict[str, float]:
    rng = np.random.default_rng(2)
    b, t = 64, 12
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[0] = 0
    log_w = rng.normal(0.0, 0.4, (b, t))
    log_w[1, :3] = [30.0, -25.0, 8.0]  # past the ±20 clamp
    mask[1, :3] = 1
    learner, engine = log_w - 1.0, np.full((b, t), -1.0)
    lo, hi = 0.8, 1.25
    weights, keep, _ = rollout_correction.correct(learner, engine, mask, tis_cap=2.0, seq_ratio_range=(lo, hi),
                                                  convention="seq_mean_k1")
    lw = torch.tensor(log_w)
    tm = torch.tensor(mask, dtype=torch.float64)
    theirs_w, _ = rc.compute_rollout_correction_weights(lw, tm, rollout_is="token", rollout_is_threshold=2.0)
    theirs_mask, _ = rc.compute_rollout_rejection_mask(lw, tm, rollout_rs="seq_mean_k1",
                                                       rollout_rs_threshold=f"{lo}_{hi}")
    rows = mask.sum(1) > 0
    theirs_keep = ~rows | (theirs_mask.numpy().sum(1) > 0)
    stat = -(np.clip(log_w, -20, 20) * mask).sum(1) / np.maximum(mask.sum(1), 1)
    clear = (np.abs(stat - np.log(lo)) > 1e-6) & (np.abs(stat - np.log(hi)) > 1e-6)
    return {"tis_abs": float(np.abs(weights - theirs_w.numpy()).max()),
            "keep_differs": int((keep != theirs_keep)[clear].sum()), "rows_masked": int((~keep & rows).sum()),
            "rows_compared": int(clear.sum())}


def main(root: str) -> None:
    ca, rc = load_verl(root)
    out = {"policy_loss": {mode: policy_loss(ca, mode) for mode in objective.LOSS_AGGREGATIONS},
           "advantages": advantages(ca), "rollout_correction": rollout_corr(rc)}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

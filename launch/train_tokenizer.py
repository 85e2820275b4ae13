"""(Re)builds the shipped tiny tokenizer (bat_jax/assets/tiny_tokenizer/).

    python -m launch.train_tokenizer [--out bat_jax/assets/tiny_tokenizer] [--vocab_size 3584]
        [--num_docs 3000] [--seed 0]

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from bat_jax.models import tokenizer as tiny
from bat_jax.benchmarks.imaging.heldout import sample_training_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=tiny.TINY_TOKENIZER_DIR)
    parser.add_argument("--vocab_size", type=int, default=tiny.TINY_VOCAB_SIZE)
    parser.add_argument("--num_docs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    tok = tiny.train_tiny_tokenizer(tiny.generate_corpus(args.num_docs, args.seed, sample_training_prompt),
                                    args.vocab_size)
    out = tiny.save_tiny_tokenizer(tok, args.out)
    loaded = tiny.load_tiny_tokenizer(out)
    probe = next(tiny.generate_corpus(4, args.seed + 1, sample_training_prompt))
    if loaded.encode(probe, add_special_tokens=False) != tok.encode(probe).ids:
        raise SystemExit(f"{out}: transformers encodes differently from the trained tokenizer")
    size_kb = sum(p.stat().st_size for p in out.iterdir()) / 1024
    print(f"wrote {out} ({tok.get_vocab_size()} tokens, {size_kb:.0f} KiB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

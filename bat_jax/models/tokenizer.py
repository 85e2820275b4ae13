"""The embedded tiny tokenizer: a small byte-level BPE with the Qwen3.5 added tokens and chat template.

Details: docs/design.md.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
from collections.abc import Callable, Iterator
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from bat_jax.atomic_io import atomic_directory
from bat_jax.models import chat

#: Shipped tokenizer directory.
TINY_TOKENIZER_DIR = pathlib.Path(__file__).resolve().parents[1] / "assets" / "tiny_tokenizer"
#: Total vocabulary size of the shipped tokenizer (learned tokens + Qwen3.5 added tokens).
TINY_VOCAB_SIZE = 3584
#: Qwen3.5 pre-tokenisation regex (transformers `Qwen3_5Tokenizer`).
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_ORGANS = ["liver", "spleen", "pancreas", "left kidney", "right kidney", "lung nodule", "brain tumor",
           "prostate", "heart left ventricle", "aorta", "gallbladder", "bladder", "hippocampus", "colon"]
_MODALITIES = ["CT", "MRI T1", "MRI T2", "FLAIR", "PET", "ultrasound", "X-ray", "DWI", "contrast-enhanced CT"]
_FORMATS = [("nii.gz", "nibabel"), ("dcm", "pydicom"), ("npy", "numpy"), ("png", "skimage.io")]
_METRICS = ["Dice", "HD95", "IoU", "sensitivity", "specificity", "AUC", "volume error", "accuracy"]
_VARS = ["img", "mask", "seg", "vol", "data", "arr", "labels", "pred", "gt", "spacing", "affine", "hdr"]
_TOOLS = ["numpy", "scipy.ndimage", "skimage.filters", "skimage.measure", "sklearn.cluster", "nibabel"]
_WORDS = ("the of and to in is for with on as by this that from are be an at we our which each image images "
          "voxel voxels slice slices volume segmentation label labels mask masks threshold region connected "
          "component largest patient study series scan scans file files directory output input result "
          "results report write read load save check verify compute measure metric score error shape dtype "
          "spacing origin orientation header affine intensity histogram normalize resample crop pad "
          "pipeline stage task plan data environment setup validate submit workspace however therefore "
          "because should could would must may might can will not no yes all any some more most less first "
          "last next previous before after during while until again also only just still even then than "
          "there here where when what who how why other same different new old large small high low left "
          "right upper lower anterior posterior axial sagittal coronal lesion tumor tissue organ vessel bone "
          "brain chest abdomen pelvis contrast phase window level noise artifact smoothing kernel filter edge "
          "gradient morphology erosion dilation opening closing hole fill boundary surface distance mean "
          "median variance standard deviation percentile minimum maximum sum count ratio fraction percent "
          "millimeter pixel resolution dimension axis channel batch model training inference prediction "
          "probability softmax sigmoid network layer weight checkpoint epoch loss optimizer learning rate "
          "dataset split train test validation fold cross sample subject cohort clinical diagnosis "
          "radiologist annotation ground truth reference manual automatic quality control failure success "
          "missing corrupted invalid empty found exists created updated deleted returned raised printed "
          "installed imported defined called expected actual observed because since although unless "
          "False None True and as assert async await break class continue def del elif else except finally "
          "for from global if import in is lambda nonlocal not or pass raise return try while with yield "
          "abs bool bytes dict enumerate filter float format getattr hasattr int isinstance len list map "
          "max min next object open print range repr reversed round set sorted str sum tuple type zip "
          "json os sys re math time glob shutil subprocess argparse logging collections itertools functools "
          "dataclasses typing pathlib tempfile hashlib csv pandas torch monai SimpleITK nibabel pydicom "
          "echo grep sed awk find xargs sort uniq head tail cut tr cat less chmod chown mkdir rmdir touch "
          "export source unset alias which whoami uname python pip install version usage help option flag "
          "argument parameter function method module package library script command shell terminal "
          "process thread memory disk cpu gpu device timeout exit status code stdout stderr warning "
          "exception traceback syntax indentation attribute index key value type permission denied such "
          "cannot allocate unsupported unknown failed succeeded completed running stopped finished started "
          "kidney kidneys liver hepatic renal pulmonary cardiac cerebral spinal vertebra rib femur knee "
          "retina fundus skin melanoma nodule nodules polyp cyst edema hemorrhage infarct stenosis fracture "
          "malignant benign grade stage staging survival response therapy treatment radiotherapy dose "
          "registration atlas template landmark transform rigid affine deformable warp interpolation "
          "nearest linear cubic spline bspline isotropic anisotropic thickness gap overlap coverage "
          "sequence acquisition protocol scanner vendor manufacturer field strength echo repetition "
          "hounsfield unit units intensity bias correction skull stripping brain extraction").split()
_IDENT_PARTS = ("get set load save read write parse build make run check find compute apply to from is has "
                "num max min mean std idx count path dir file name case mask img vol seg label arr out in tmp "
                "cfg args opts result results score metric thr val size shape dims spacing origin affine "
                "header meta info list dict map key item value total batch step iter").split()  # fmt: skip


def _identifier(rng: random.Random) -> str:
    return "_".join(rng.sample(_IDENT_PARTS, rng.randint(1, 3)))


def _code_lines(rng: random.Random) -> str:
    """Generic python lines with random identifiers, calls and literals."""
    out = []
    for _ in range(rng.randint(3, 12)):
        a, b, c = _identifier(rng), _identifier(rng), _identifier(rng)
        out.append(rng.choice([
            f"{a} = {b}({c}, axis={rng.randint(-1, 3)})", f"def {a}({b}, {c}=None):", f"    return {b}[{c}]",
            f"if {a} is None or len({b}) == 0:", f"    raise ValueError(f'{a}: {{{b}!r}}')",
            f"class {a.title().replace('_', '')}:", f"    self.{a} = {b}.{c}()", f"{a}.append({b} * {rng.random():.3f})",
            f"for {a}, {b} in enumerate(sorted({c})):", f"print('{a}', {b}, sep='\\t')", f"assert {a} == {b}, {c}",
            f"{a} = [{b} for {b} in {c} if {b} > {rng.randint(0, 255)}]", f"{a} = {{'{b}': {c}, 'n': {rng.randint(0, 99)}}}",
            f"with open({a}, 'rb') as fh:", f"    {a} = json.loads(fh.read())", f"return {a} / max({b}, 1e-{rng.randint(3, 9)})",
        ]))  # fmt: skip
    return "\n".join(out) + "\n"


def _python_snippet(rng: random.Random) -> str:
    ext, lib = rng.choice(_FORMATS)
    v, w = rng.sample(_VARS, 2)
    organ = rng.choice(_ORGANS).replace(" ", "_")
    n = rng.randint(0, 999)
    lines = [
        f"import {lib}" if "." not in lib else f"from {lib.rsplit('.', 1)[0]} import {lib.rsplit('.', 1)[1]}",
        "import numpy as np",
        "from pathlib import Path",
        "",
        f"def load_{organ}(path: str) -> np.ndarray:",
        f'    """Load the {organ} {rng.choice(_MODALITIES)} volume."""',
        f"    {v} = nibabel.load(path).get_fdata()" if ext == "nii.gz" else f"    {v} = np.load(path)",
        f"    return {v}.astype(np.float32)",
        "",
        f"{w} = load_{organ}('data/case_{n:03d}.{ext}')",
        f"print({w}.shape, {w}.dtype, float({w}.min()), float({w}.max()))",
        f"{v} = ({w} > {rng.choice([0.5, 100, 200, -500, 1])}).astype(np.uint8)",
        f"for i in range({v}.shape[0]):",
        f"    if {v}[i].sum() > {rng.randint(1, 50)}:",
        f"        print(f'slice {{i}}: {{int({v}[i].sum())}} voxels')",
        f"dice = 2 * np.logical_and({v}, gt).sum() / ({v}.sum() + gt.sum() + 1e-8)",
        f"with open('output/{organ}_report.json', 'w') as f:",
        f"    json.dump({{'dice': float(dice), 'case': {n}}}, f, indent=2)",
        "try:\n    import scipy.ndimage as ndi\nexcept ImportError as e:\n    raise SystemExit(str(e))",
        f"labels, num = ndi.label({v})\nsizes = ndi.sum({v}, labels, range(1, num + 1))",
        "if __name__ == '__main__':\n    main()",
    ]
    k = rng.randint(4, len(lines))
    return "\n".join(rng.sample(lines, k)) + "\n"


def _bash_snippet(rng: random.Random) -> str:
    ext, _ = rng.choice(_FORMATS)
    d = rng.choice(["data", "output", "workspace", "inputs", "results", "/tmp/work"])
    cmds = [
        f"ls -la {d}/", f"find {d} -name '*.{ext}' | head -n {rng.randint(1, 20)}", f"mkdir -p {d}/masks",
        f"du -sh {d}", f"wc -l {d}/cases.csv", f"cat {d}/README.md", "python3 -c 'import numpy; print(numpy.__version__)'",
        f"python3 run.py --input {d} --output output/ --threshold {rng.random():.2f}", "pip list 2>/dev/null | grep -i nib",
        f"grep -rn 'spacing' {d} || true", f"for f in {d}/*.{ext}; do echo \"$f\"; done", "echo $?", "nproc && free -m",
        f"test -f {d}/labels.json && echo ok", f"head -c 200 {d}/meta.json", "cd /workspace && pwd",
    ]  # fmt: skip
    return "\n".join(rng.sample(cmds, rng.randint(1, 6))) + "\n"


def _task_text(rng: random.Random) -> str:
    organ, modality, metric = rng.choice(_ORGANS), rng.choice(_MODALITIES), rng.choice(_METRICS)
    ext, lib = rng.choice(_FORMATS)
    sentences = [
        f"Segment the {organ} in the {modality} scans under data/ and write binary masks as .{ext} files.",
        f"The evaluation metric is {metric}; the reference masks are hidden from the agent.",
        f"Use {lib} to read the images and check the voxel spacing before resampling to 1.0 mm.",
        f"Report the {metric} of each case in output/report.json and submit it when done.",
        f"Stage {rng.randint(1, 5)}: plan the pipeline, set up the environment, validate the data, run inference.",
        f"Case {rng.randint(0, 300):03d} has shape ({rng.randint(64, 512)}, {rng.randint(64, 512)}, "
        f"{rng.randint(20, 200)}) and intensity range [{rng.randint(-1024, 0)}, {rng.randint(100, 3000)}].",
        " ".join(rng.choices(_WORDS, k=rng.randint(8, 30))).capitalize() + ".",
    ]  # fmt: skip
    return " ".join(rng.sample(sentences, rng.randint(2, len(sentences))))


def _episode_text(rng: random.Random) -> str:
    """A rendered agent episode (Qwen3.5 glue), so that template glue strings become tokens."""
    fam = chat.CHAT_FAMILIES["qwen3_5"]
    text = f"{chat.IM_START}system\n# Tools\n\n<tools>\n"
    text += "\n".join(json.dumps(t, ensure_ascii=False) for t in chat.tool_schemas())
    text += f"\n</tools>{chat.IM_END}\n{chat.IM_START}user\n{_task_text(rng)}{chat.IM_END}\n{fam.generation_prompt}"
    for _ in range(rng.randint(1, 3)):
        language = rng.choice(["python", "bash"])
        code = _python_snippet(rng) if language == "python" else _bash_snippet(rng)
        thought = _task_text(rng)
        action = chat.Action(thought, "execute_code", {"language": language, "code": code.strip()})
        text += chat.render_action(action, fam) + chat.IM_END
        text += chat.tool_response_text(f"{rng.randint(0, 100)} files\n[exit code {rng.choice([0, 0, 1, 2])}]", fam)
    submit = chat.Action(_task_text(rng), "submit", {"path": "output/report.json"})
    return text + chat.render_action(submit, fam) + chat.IM_END + "\n"


def generate_corpus(num_docs: int = 3000, seed: int = 0,
                    brief_text: Callable[[random.Random], str] | None = None) -> Iterator[str]:
    """Yields `num_docs` deterministic training documents for the tiny tokenizer.

    They are python, bash, task text, rendered episodes and, with `brief_text` (rng → a training-split first user turn:
    brief + stage skills, never held-out text; the shipped tokenizer used the imaging suite's
    `tasks.heldout.sample_training_prompt`), task briefs, so that the agent's prompts tokenise compactly."""
    rng = random.Random(seed)
    makers = (_python_snippet, _code_lines, _bash_snippet, _task_text, _episode_text) + (
        (brief_text,) if brief_text is not None else ())
    for i in range(num_docs):
        yield makers[i % len(makers)](rng)


def train_tiny_tokenizer(corpus: Iterator[str], vocab_size: int = TINY_VOCAB_SIZE) -> Tokenizer:
    """Trains the byte-level BPE on `corpus` and appends the Qwen3.5 added tokens after the learned vocab.

    Returns a `tokenizers.Tokenizer` of exactly `vocab_size` tokens. Raises ValueError when `vocab_size`
    leaves no room beyond the 256 byte tokens and the added tokens, or the corpus is too small to fill it.
    """
    n_added = len(chat.QWEN3_5_SPECIAL_TOKENS)
    learned = vocab_size - n_added
    if learned <= 256:
        raise ValueError(f"vocab_size {vocab_size} too small: needs > 256 byte tokens + {n_added} added tokens")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_5_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=learned, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )  # fmt: skip
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != learned:
        raise ValueError(f"corpus too small: learned {tok.get_vocab_size()} tokens, wanted {learned}")
    tok.add_tokens([
        AddedToken(t, special=t not in chat.NON_SPECIAL_ADDED_TOKENS, normalized=False)
        for t in chat.QWEN3_5_SPECIAL_TOKENS
    ])  # fmt: skip
    return tok


def _tokenizer_config(tok: Tokenizer) -> dict[str, Any]:
    decoder = {}
    for t in chat.QWEN3_5_SPECIAL_TOKENS:
        decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t not in chat.NON_SPECIAL_ADDED_TOKENS,
        }  # fmt: skip
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": chat.QWEN3_5_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": chat.IM_END,
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": chat.ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen3_5Tokenizer",
        "unk_token": None,
    }


def save_tiny_tokenizer(tok: Tokenizer, out_dir: str | pathlib.Path) -> pathlib.Path:
    """Writes the tiny tokenizer's files into `out_dir`, all or nothing; returns `out_dir`.

    The files are tokenizer.json, tokenizer_config.json (with the Qwen3.5 chat template) and special_tokens_map.json,
    written all or nothing (`atomic_io.atomic_directory`)."""
    with atomic_directory(out_dir) as tmp:
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(tok), indent=2) + "\n")
        specials = {"eos_token": chat.IM_END, "pad_token": chat.ENDOFTEXT,
                    "additional_special_tokens": [t for t in chat.QWEN3_5_SPECIAL_TOKENS
                                                  if t not in chat.NON_SPECIAL_ADDED_TOKENS]}  # fmt: skip
        (tmp / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return pathlib.Path(out_dir)


def tokenizer_digest(directory: str | pathlib.Path) -> str:
    """SHA-256 hex over a tokenizer directory's tokenizer.json and tokenizer_config.json.

    It hashes names and bytes and is the tokenizer identity recorded in derived views. Raises FileNotFoundError when
    tokenizer.json is missing."""
    directory = pathlib.Path(directory)
    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = directory / name
        if name == "tokenizer.json" and not path.is_file():
            raise FileNotFoundError(f"{directory}: no tokenizer.json")
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def load_tiny_tokenizer(path: str | pathlib.Path = TINY_TOKENIZER_DIR) -> Any:
    """The shipped tiny tokenizer as a `transformers` `Qwen3_5Tokenizer`.

    It loads offline and is what `AutoTokenizer.from_pretrained(path)` returns too. Raises FileNotFoundError when the
    files are missing."""
    path = pathlib.Path(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json; run launch/train_tokenizer.py")
    # The class AutoTokenizer resolves this directory to, imported directly: skips importing torch.
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    return Qwen3_5Tokenizer.from_pretrained(str(path), local_files_only=True)

"""The package's docstrings stay skimmable: few sentences over 50 words, none pointing outside the repository."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_LONG_SENTENCES = 40  # sentences over 50 words in every module, class and function docstring of bat_jax
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
OUTSIDE = re.compile(r"DESIGN\.md|REFERENCE\.md|ENVIRONMENT\.md|shared/|\bissue \d+")


def docstrings() -> list[tuple[str, int, str]]:
    """(file, line, docstring) of every module, class and function of the package."""
    out = []
    for path in sorted((REPO / "bat_jax").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append((str(path.relative_to(REPO)), getattr(node, "lineno", 1), doc))
    return out


def long_sentences(text: str, limit: int = 50) -> list[str]:
    """The sentences of `text` (split after . ! or ? and whitespace) with more than `limit` words."""
    return [s for s in SENTENCE_END.split(text) if len(s.split()) > limit]


def test_long_sentences_are_split_on_hand_made_text():
    short = "One two three. Four five? Six!"
    assert long_sentences(short) == []
    long = " ".join(["word"] * 51) + ". " + " ".join(["word"] * 50) + "."
    assert long_sentences(long) == [" ".join(["word"] * 51) + "."]


def test_at_most_40_docstring_sentences_over_50_words():
    found = [(f, line, s) for f, line, doc in docstrings() for s in long_sentences(doc)]
    listing = "\n".join(f"{f}:{line}: {len(s.split())} words: {s[:80]}…" for f, line, s in found)
    assert len(found) <= MAX_LONG_SENTENCES, f"{len(found)} sentences over 50 words:\n{listing}"


def test_docstrings_cite_the_paper_not_documents_outside_the_repository():
    found = [f"{f}:{line}: {m.group(0)}" for f, line, doc in docstrings() for m in OUTSIDE.finditer(doc)]
    assert found == [], found


def test_every_module_docstring_opens_with_a_one_line_summary():
    found = []
    for path in sorted((REPO / "bat_jax").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc is None:
            continue
        lines = doc.split("\n")
        if not lines[0].rstrip().endswith((".", ":")) or (len(lines) > 1 and lines[1].strip()):
            found.append(f"{path.relative_to(REPO)}: {lines[0][:60]}")
    assert found == [], found

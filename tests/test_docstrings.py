"""The package's docstrings stay skimmable: a one-line summary first, few sentences over 50 words, none pointing
outside the repository; a module docstring (bat_jax/ and launch/) is a summary and at most one short paragraph,
at most 60 words (design rationale lives in docs/design.md)."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_LONG_SENTENCES = 40  # sentences over 50 words in every module, class and function docstring of bat_jax
MAX_MODULE_WORDS = 60  # words in a module docstring of bat_jax/ or launch/
POINTER = "Details: docs/design.md."  # a module docstring's last line where its rationale moved there
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


def opens_with_a_one_line_summary(doc: str) -> bool:
    """Whether `doc` opens with a one-line summary: its first line ends a sentence ('.' or ':'), the next is blank."""
    lines = doc.split("\n")
    return lines[0].rstrip().endswith((".", ":")) and (len(lines) == 1 or not lines[1].strip())


def test_one_line_summary_check_on_hand_made_docstrings():
    assert opens_with_a_one_line_summary("Returns the answer.")
    assert opens_with_a_one_line_summary("Returns the answer.\n\nMore text that\nwraps.")
    assert opens_with_a_one_line_summary("Fields:\n\n  a: one.")
    # The first sentence wraps onto line 2.
    assert not opens_with_a_one_line_summary("Returns the answer of the task\nwhen it has one.")
    # A complete first line, but no blank line before the rest.
    assert not opens_with_a_one_line_summary("Returns the answer.\nMore text.")
    # One line that is not a sentence.
    assert not opens_with_a_one_line_summary("Returns the answer")


def test_every_docstring_opens_with_a_one_line_summary():
    found = [f"{f}:{line}: {doc.splitlines()[0][:70]}" for f, line, doc in docstrings()
             if not opens_with_a_one_line_summary(doc)]
    assert found == [], f"{len(found)} docstrings without a one-line summary first:\n" + "\n".join(found)


def test_docstrings_walks_modules_classes_and_functions():
    kinds = {"module": 0, "other": 0}
    for f, line, doc in docstrings():
        kinds["module" if line == 1 else "other"] += 1
    # bat_jax has over 1,000 class and function docstrings beside its module docstrings.
    assert kinds["other"] > 1000 and kinds["module"] > 50, kinds


def module_docstrings() -> list[tuple[str, str]]:
    """(file, docstring) of every module under bat_jax/ and launch/ that has one."""
    out = []
    for root in ("bat_jax", "launch"):
        for path in sorted((REPO / root).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()))
            if doc:
                out.append((str(path.relative_to(REPO)), doc))
    return out


def paragraphs(doc: str) -> list[str]:
    """The paragraphs of `doc`: runs of lines separated by blank lines."""
    return [p for p in re.split(r"\n[ \t]*\n", doc.strip()) if p.strip()]


def test_paragraphs_on_hand_made_text():
    assert paragraphs("Summary.") == ["Summary."]
    assert paragraphs("Summary.\n\nOne\nparagraph.\n  \nTwo.") == ["Summary.", "One\nparagraph.", "Two."]


def test_module_docstrings_are_a_summary_and_at_most_one_short_paragraph():
    found = [f"{f}: {len(doc.split())} words, {len(paragraphs(doc))} paragraphs" for f, doc in module_docstrings()
             if len(doc.split()) > MAX_MODULE_WORDS or not opens_with_a_one_line_summary(doc)
             or len([q for q in paragraphs(doc) if q != POINTER]) > 2]
    assert found == [], "module docstrings over the bound (move the rest to docs/design.md):\n" + "\n".join(found)


def test_module_docstrings_walk_both_trees():
    files = [f for f, _ in module_docstrings()]
    assert any(f.startswith("launch/bench/") for f in files) and len(files) > 150, len(files)

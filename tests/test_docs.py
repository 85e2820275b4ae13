"""README is a short landing page and docs/ holds the rest: the two set-up commands verbatim, every docs page
linked from README, every relative link and anchor in README and docs/ resolving, every repository path the pages
name in backticks existing."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 300
#: The two set-up commands on a fresh machine (README): the main job on the tiny default, and the tests (CI's).
MAIN_COMMAND = "bash launch/setup.sh && python -m bat_jax.launch --gin_file=bicurl_tiny.gin"
TEST_COMMAND = "bash launch/setup.sh --with-vllm && python -m pytest -n 2 --dist=loadgroup tests"
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: A path in backticks that starts at a top-level folder of the repository and names a file.
REPO_PATH = re.compile(r"`((?:bat_jax|launch|gin|tests|docs)/[\w/.-]+\.(?:py|gin|md|json|sh|txt))`")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors of every heading of `page` (outside fenced code)."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(anchor(line.lstrip("#")))
    return out


def test_anchor_on_hand_made_headings():
    assert anchor("GPU: first contact") == "gpu-first-contact"
    assert anchor(" Paper scale that fits: per-device memory from the XLA compiler") == \
        "paper-scale-that-fits-per-device-memory-from-the-xla-compiler"
    assert anchor("The tiny default, measured") == "the-tiny-default-measured"
    assert anchor("Paper scale: `bicurl_9b.gin` on 8×A100") == "paper-scale-bicurl_9bgin-on-8a100"


def test_readme_is_a_landing_page_with_the_two_commands_verbatim():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert f"```bash\n{MAIN_COMMAND}\n```" in text
    assert f"```bash\n{TEST_COMMAND}\n```" in text
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == TEST_COMMAND
    assert "## What to expect" in text


def test_readme_links_every_docs_page():
    linked = set(LINK.findall(README.read_text()))
    assert [p.name for p in PAGES if f"docs/{p.name}" not in linked] == []


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in [README, *PAGES]:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no file)")
            elif frag and frag not in anchors(dest):
                broken.append(f"{page.name}: {target} (no heading)")
    assert broken == []


def test_paths_the_pages_name_exist():
    missing = sorted({f"{page.name}: {m}" for page in [README, *PAGES] for m in REPO_PATH.findall(page.read_text())
                      if not (REPO / m).exists() and not (REPO / "gin" / m).exists()})
    assert missing == []

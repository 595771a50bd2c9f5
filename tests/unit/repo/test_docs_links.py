"""The documentation holds together: every relative link in README.md and docs/ reaches a file or
folder (and, with `#anchor`, a heading of that page), the README stays short, and it links every
topic page; its annotated recipe is the shipped quickstart."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import yaml

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
README = REPO / "README.md"
MAX_README_LINES = 300

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1)(?!\n[ \t]*\n)[\s\S])+?\1")
_LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(?P<title>.*?)\s*#*\s*$")


def _pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose(path: Path) -> str:
    """A page's text with fenced code blocks and inline code spans blanked, line breaks kept."""
    kept: list[str] = []
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            line = ""
        kept.append("" if in_fence else line)
    return _CODE_SPAN.sub(lambda span: "\n" * span.group(0).count("\n"), "\n".join(kept))


def _links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of each relative link on a page, link text that wraps across lines
    included; web and mail links are skipped."""
    text = _prose(path)
    for match in _LINK.finditer(text):
        target = match.group("target").strip("<>")
        if not re.match(r"(https?:|mailto:)", target, re.IGNORECASE):
            yield text.count("\n", 0, match.start()) + 1, target


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercase, punctuation dropped except
    hyphens, spaces and underscores, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else _HEADING.match(line)
        if match:
            slug = _slug(match.group("title"))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    """The path a link reaches from its page, and its anchor ('' when none)."""
    where, _, anchor = target.partition("#")
    return (page.parent / unquote(where)).resolve() if where else page, unquote(anchor)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def test_every_relative_link_reaches_a_file_and_a_heading() -> None:
    broken: list[str] = []
    anchors: dict[Path, set[str]] = {}
    for page in _pages():
        for number, target in _links(page):
            path, anchor = _resolve(page, target)
            where = f"{_name(page)}:{number}: ({target})"
            if not path.exists():
                broken.append(f"{where}: no file or folder {_name(path)}")
            elif anchor and path.suffix == ".md":
                if path not in anchors:
                    anchors[path] = _anchors(path)
                if anchor not in anchors[path]:
                    broken.append(f"{where}: no heading #{anchor} in {_name(path)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to a docs/ page"
    )


def test_the_readme_links_every_topic_page() -> None:
    linked = {_resolve(README, target)[0] for _, target in _links(README)}
    pages = sorted([*DOCS.glob("*.md"), *(DOCS / "options").glob("*.md")])
    unlinked = [_name(page) for page in pages if page.resolve() not in linked]
    assert not unlinked, f"README.md's table of topics does not link: {', '.join(unlinked)}"


def test_the_link_checker_sees_links_anchors_and_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A title\n\n## Using the engine's numbers (`auto`)\n\n## Again\n\n## Again\n\n"
        "[a](other.md#x) ![b](img.png) [web](https://example.com) `[not](code.md)`\n"
        "```\n[nor](fenced.md)\n```\n[wrapped\nacross lines](two.md) `a code\nspan [no](x.md)`\n",
        encoding="utf-8",
    )
    assert list(_links(page)) == [(9, "other.md#x"), (9, "img.png"), (13, "two.md")]
    assert _anchors(page) == {"a-title", "using-the-engines-numbers-auto", "again", "again-1"}
    assert _slug("Overlong filtering (`algorithm.mask_truncated`)") == (
        "overlong-filtering-algorithmmask_truncated"
    )


def test_the_readmes_annotated_recipe_is_the_quickstart() -> None:
    """The README's annotated recipe is `recipes/quickstart.yaml` with comments added: the
    same keys and values, so a change of the shipped task cannot leave the README behind."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A recipe, annotated") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") :]
    annotated = yaml.safe_load(block[: block.index("```")])
    shipped = yaml.safe_load((REPO / "recipes" / "quickstart.yaml").read_text(encoding="utf-8"))
    assert annotated == shipped

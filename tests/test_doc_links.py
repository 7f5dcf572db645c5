"""Every relative link in README.md and docs/ (the measured results under docs/results/ aside) points at a file or
folder that exists, and every ``#anchor`` into a markdown page at one of its headings: files move (the layered
folders did), links must follow."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


def broken(page: Path, root: Path = ROOT) -> list[str]:
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            out.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor.lower() not in anchors(where):
            out.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return out


def test_every_link_in_the_docs_resolves():
    assert [b for page in pages() for b in broken(page)] == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# A heading, with punctuation\n")
    page.write_text("[ok](other.md#a-heading-with-punctuation) [gone](nowhere.py) [bad](other.md#nope) "
                    "[web](https://example.org/x)\n")
    assert broken(page, tmp_path) == ["page.md: nowhere.py (no such file)", "page.md: other.md#nope (no such heading)"]

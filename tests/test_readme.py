"""The README: at most 300 lines, its example runs, its links resolve, its headline figures
are the ones of the pages it links to."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            lines.append(anchor(line))
    return set(lines)


def local_links(path: Path):
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if not target.startswith(("http://", "https://", "mailto:")):
            file, _, frag = target.partition("#")
            yield target, (path.parent / file).resolve() if file else path, frag


def test_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_links_of_the_readme_and_docs_resolve():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target, file, frag in local_links(page):
            if not file.exists() or (frag and file.suffix == ".md" and frag not in anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_headline_figures_are_those_of_the_linked_pages():
    """Every number of a results row of the README appears in the page that row links to."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|") and "](docs/" in r]
    assert len(rows) >= 5
    for row in rows:
        what, result, details = [c.strip() for c in row.strip("|").split("|")]
        target = (ROOT / LINK.search(details).group(1).partition("#")[0])
        page = target.read_text(encoding="utf-8")
        for number in NUMBER.findall(result):
            assert number in page, f"README: {number} ({what}) is not in {target.relative_to(ROOT)}"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    done = subprocess.run([sys.executable, "-c", blocks[0]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip()
    assert printed.startswith("[[") and printed.count("[") == 3, printed


def test_api_guide_python_examples_run_in_order():
    """docs/api.md's examples build on each other: run them in one interpreter, in order."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 4
    program = "\n".join(f"exec(compile({b!r}, 'docs/api.md example {i + 1}', 'exec'))" for i, b in enumerate(blocks))
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

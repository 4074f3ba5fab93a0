"""docs/api.md lists every public name of every public subpackage, and its links
lead somewhere: the index cannot rot as the API grows."""

import importlib
import pathlib
import pkgutil
import re
import types

import pytest

import fedjax_pfl

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API = DOCS / "api.md"
# Pages whose links are checked (the pages written for users to navigate).
LINKED_PAGES = ("api.md", "own_experiment.md", "models.md", "datasets.md")


def public_modules() -> list[str]:
    subs = sorted(m.name for m in pkgutil.iter_modules(fedjax_pfl.__path__)
                  if not m.name.startswith("_"))
    return ["fedjax_pfl"] + [f"fedjax_pfl.{s}" for s in subs]


def public_names(module) -> list[str]:
    """``__all__``, else every public attribute that is not a submodule."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")
                 and not (isinstance(getattr(module, n), types.ModuleType)
                          and module.__name__ != "fedjax_pfl")]
    return sorted(names)


def sections(text: str) -> dict[str, str]:
    """``{module: section text}`` of the ``## `module` `` headings."""
    parts = re.split(r"^## `([\w.]+)`\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def headings_to_anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (fenced code skipped)."""
    anchors, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


@pytest.mark.parametrize("name", public_modules())
def test_every_public_name_is_indexed(name):
    module = importlib.import_module(name)
    index = sections(API.read_text())
    assert name in index, f"docs/api.md has no section '## `{name}`'"
    missing = [n for n in public_names(module) if f"`{n}`" not in index[name]]
    assert not missing, (f"docs/api.md, section {name}: add a row (what it is, "
                         f"which page explains it) for {missing}")


def test_index_has_no_unknown_section():
    assert set(sections(API.read_text())) <= set(public_modules())


def test_every_row_names_a_page():
    for module, body in sections(API.read_text()).items():
        for row in body.splitlines():
            cells = row.split("|")
            if not row.startswith("| `") or "as in [" in row:
                continue
            assert len(cells) == 5, f"{module}: a row with {len(cells) - 2} cells " \
                f"(a '|' inside a cell?): {row}"
            assert re.search(r"\]\([\w-]+\.md", cells[3]), f"{module}: {row}"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_links_resolve(page):
    text = (DOCS / page).read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        path, _, anchor = target.partition("#")
        file = (DOCS / path).resolve() if path else DOCS / page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and \
                anchor not in headings_to_anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"docs/{page}: links to nothing: {broken}"

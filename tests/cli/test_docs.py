"""The documentation agrees with the code: the pages generated from it are current, every
command has help, an example in its help and an example in the written docs, every setting
is explained, every link between pages resolves, every extra the docs name exists, and the
user docs speak to users, not about the project's history."""

from __future__ import annotations

import re
import tomllib
from urllib.parse import unquote

import pytest

from audit import docs
from audit.config import SCHEMA, defaults
from audit.docs import github_anchor, help_text, iter_commands
from tests.docs_pages import command_path, shell_command_lines, user_pages, written_pages
from tests.helpers import REPO

COMMANDS = list(iter_commands())
LEAVES = [(path, command) for path, command in COMMANDS if not hasattr(command, "commands")]
GENERATED = docs.generated_pages()
# Pages other branches write (the SwanLab and trackio importers): linked before they land.


# -- generated pages ----------------------------------------------------------------------------
@pytest.mark.parametrize("page", sorted(GENERATED))
def test_generated_page_is_current(page):
    path = REPO / page
    assert path.exists() and path.read_text(encoding="utf-8") == GENERATED[page], (
        f"{page} is stale: run `make docs`"
    )


def test_every_rule_page_is_a_rule_s():
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / docs.RULES_DIR).glob("*.md")}
    assert on_disk == {p for p in GENERATED if p.startswith(docs.RULES_DIR)}


@pytest.mark.parametrize("page", docs.TEMPLATES)
def test_generated_blocks_are_current(page):
    text = (REPO / page).read_text(encoding="utf-8")
    assert docs.fill_blocks(text, page) == text, f"{page} is stale: run `make docs`"


def test_every_generated_block_is_on_a_page():
    on_pages = {
        m["name"]
        for page in docs.TEMPLATES
        for m in docs.BLOCK.finditer((REPO / page).read_text(encoding="utf-8"))
    }
    assert on_pages == set(docs.blocks())


@pytest.mark.parametrize("section", sorted(SCHEMA))
def test_configuration_blocks_read_back_as_the_defaults(section):
    assert tomllib.loads(docs.config_section_toml(section)) == {section: defaults()[section]}


def test_rule_threshold_blocks_read_back_as_the_defaults():
    read = tomllib.loads(docs.rules_toml(docs.builtin_rules()))["rules"]
    expected = {
        rule.code: {key: t.default for key, t in rule.thresholds.items()}
        for rule in docs.builtin_rules()
        if rule.thresholds
    }
    assert read == expected


def _section_text(page: str, heading: str) -> str:
    """A section's hand-written text: from its heading to the next, generated blocks out."""
    text = (REPO / page).read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return docs.BLOCK.sub("", section)


@pytest.mark.parametrize("section", sorted(SCHEMA))
def test_every_setting_is_explained(section):
    text = _section_text("docs/configuration.md", f"## `[{section}]`")
    missing = [key for key in SCHEMA[section] if f"`{key}`" not in text]
    assert not missing, f"docs/configuration.md [{section}] does not explain {missing}"


# -- commands -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_help_and_an_example(path, command):
    text = help_text(path, command)
    assert command.help and command.help.strip(), f"{' '.join(path)} has no help text"
    assert "Example:" in text, f"{' '.join(path)} has no example"
    assert f"audit {' '.join(path[1:])}".strip() in text.split("Example:")[1]


def test_every_option_has_help():
    for path, command in COMMANDS:
        for param in command.params:
            if param.param_type_name == "option" and param.name not in ("help", "version"):
                assert param.help, f"{' '.join(path)} {param.opts[0]} has no help"


def test_version(run_cli):
    code, out, _ = run_cli("--version")
    assert (code, out) == (0, "audit, version 0.1.0\n")


SHOWN = {command_path(args) for _, args in shell_command_lines(written_pages())}


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_is_shown_in_the_written_docs(path):
    """Each command appears in an example a person wrote (README or docs/), besides the
    generated reference: a new command needs a word on where it fits."""
    assert path in SHOWN, f"no sh example in README.md or docs/ runs `{' '.join(path)}`"


# -- pages --------------------------------------------------------------------------------------
def _prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are examples, not links)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _anchors(text: str) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", _prose(text), flags=re.M)}


def _link_targets(text: str) -> list[str]:
    """Markdown link targets outside code (fenced blocks and inline spans)."""
    return re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", _prose(text)))


def _links():
    for page in user_pages():
        for target in _link_targets(page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", target):
                yield page, target


LINKS = list(_links())


@pytest.mark.parametrize(
    ("page", "target"), LINKS, ids=[f"{p.relative_to(REPO)}->{t}" for p, t in LINKS]
)
def test_links_between_pages_resolve(page, target):
    file_part, _, anchor = target.partition("#")
    linked = (page.parent / unquote(file_part)).resolve() if file_part else page
    assert linked.exists(), f"{page.relative_to(REPO)} links to {target}: no such file"
    if anchor and linked.suffix == ".md":
        assert anchor in _anchors(linked.read_text(encoding="utf-8")), (
            f"{page.relative_to(REPO)} links to {target}: no such heading"
        )


def test_every_page_is_reachable_from_the_readme():
    reached, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached or not page.exists():
            continue
        reached.add(page)
        for target in _link_targets(page.read_text(encoding="utf-8")):
            file_part = target.partition("#")[0]
            if not re.match(r"[a-z]+:", target) and file_part.endswith(".md"):
                todo.append((page.parent / unquote(file_part)).resolve())
    unreached = [p.relative_to(REPO).as_posix() for p in user_pages() if p not in reached]
    assert not unreached, f"no link leads to {unreached}"


def test_every_extra_the_docs_name_exists():
    with open(REPO / "pyproject.toml", "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    named = set()
    for page in [*user_pages(), REPO / "Makefile"]:
        text = page.read_text(encoding="utf-8")
        for group in re.findall(r"(?:audit-waste|['\"]\.)\[([\w,-]+)\]", text):
            named |= set(group.split(","))
        named |= set(re.findall(r"the `([\w-]+)` extra", text))
    assert named and named <= extras, f"the docs name extras pyproject.toml lacks: {named - extras}"


HISTORY = re.compile(
    r"\b(?:issue|round|session)s?\s*#?\d+"  # "issue 18's targets", "round 3"
    r"|\b(?:first|second|third|\w+teenth|\w+tieth)\s+session",  # "the thirteenth session"
    re.I,
)


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_user_docs_carry_no_project_history(page):
    found = HISTORY.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(REPO)} speaks of the project's history: {found}"

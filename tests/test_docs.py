"""The documentation a new user reads is true where a test can tell: every generated part matches
the code, every page is reachable from docs/index.md, every reason code is explained, the CLI help
is plain text, and the pages cite only what the repository holds or public sources."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvtier.advice import ADVICE, WIRE_ADVICE
from kvtier.cli import cli
from kvtier.lifecycle import REASON_DOCS, Reason
from kvtier.wire.codec import WIRE_REASON_DOCS, WireReason
from tools.docgen import PAGES, stale_pages

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_every_generated_part_of_every_page_is_fresh() -> None:
    """Tables, label values, duration limits, dependencies, CLI help, reason codes, versions."""
    assert stale_pages(ROOT) == [], "run: python -m tools docs"
    assert {"docs/troubleshooting.md", "docs/cli.md", "docs/compatibility.md"} <= set(PAGES)


def _links(page: Path) -> set[str]:
    return {m.split("#")[0] for m in re.findall(r"\]\(([^)]+)\)", page.read_text(encoding="utf-8"))
            if "://" not in m and not m.startswith("#")}


def test_the_index_reaches_every_page_and_its_links_resolve() -> None:
    index = DOCS / "index.md"
    links = _links(index)
    for target in links:
        assert (DOCS / target).resolve().exists(), f"docs/index.md links {target}, which does not exist"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
             if p.parent.name not in ("states", "release2", "symmetric", "profiles") and p.name != "index.md"}
    # (generated pages: the states' from the spec, the runs' kept beside their summaries, the
    # benchmark profiles that docs/benchmarks.md links)
    profiles = sorted(p.name for p in (DOCS / "benchmarks" / "profiles").glob("*.md"))
    assert all(f"benchmarks/profiles/{name}" in (DOCS / "benchmarks.md").read_text(encoding="utf-8") for name in profiles)
    missing = sorted(pages - {link.removeprefix("./") for link in links})
    assert missing == [], f"pages docs/index.md does not link: {missing}"
    assert "docs/index.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_troubleshooting_explains_every_reason_code() -> None:
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    for r in Reason:  # kvtier why links docs/troubleshooting.md#<reason>
        assert f'<a id="{r.value}"></a>' in text and REASON_DOCS[r] in text and ADVICE[r] in text, r
    for w in WireReason:  # each row says what the code means, not only what to change
        assert f'<a id="{w.value}"></a>`{w.value}` | {WIRE_REASON_DOCS[w]} | {WIRE_ADVICE[w]} |' in text, w
        assert WIRE_REASON_DOCS[w].strip()
    assert set(ADVICE) == set(Reason) and set(WIRE_ADVICE) == set(WireReason) == set(WIRE_REASON_DOCS)


def _commands(cmd: click.Command, name: str, parent: click.Context | None = None):
    ctx = click.Context(cmd, info_name=name, parent=parent, **cmd.context_settings)
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for sub in cmd.list_commands(ctx):
            yield from _commands(cmd.commands[sub], sub, ctx)


def test_cli_help_is_plain_text() -> None:
    for ctx, cmd in _commands(cli, "kvtier"):
        text = cmd.get_help(ctx)
        assert not re.search(r"``|:(class|mod|meth|func|data):", text), (ctx.command_path, text)
        res = CliRunner().invoke(cli, [*ctx.command_path.split()[1:], "--help"])
        assert res.exit_code == 0 and "``" not in res.output, res.output


def test_python_dash_m_kvtier_is_the_same_command_line() -> None:
    """A virtual environment whose scripts are not on PATH runs the CLI as ``python -m kvtier``."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "kvtier", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: kvtier ") and "check-config" in res.stdout, res.stdout


def test_kvtier_version_names_the_release_and_what_it_speaks() -> None:
    import tomllib

    from kvtier.wire.messages import PROTOCOL_VERSION

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0
    assert res.output.startswith("kvtier ") and f"wire protocol {PROTOCOL_VERSION}" in res.output
    assert "vLLM adapter for 0.33.0" in res.output
    import kvtier.version

    assert kvtier.version.__version__ in (version, "0+unknown")


#: What a reader of the repository cannot open: paths outside it, an internal study, issue numbers,
#: the project's release history, an internal name for vLLM's p2p tier.
_UNCITABLE = re.compile(r"shared/|limits\.md|behaviou?ral study|\bissue \d+|[Tt]he seed\b|seed's|"
                        r"(?<!\ba )\b(first|second|third|fourth) release\b")  # "a second release" of a pin is fine


@pytest.mark.parametrize("tree", ["docs", "README.md", "kvtier", "spec", "tools"])
def test_pages_and_comments_cite_only_what_a_reader_can_open(tree: str) -> None:
    root = ROOT / tree
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.suffix in (".md", ".py", ".toml")]
    bad = []
    for path in files:
        if "release2" in path.parts:  # an archived run's summary, kept as written then
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _UNCITABLE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert bad == []


def test_label_values_a_live_registry_reports_are_the_documented_ones() -> None:
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool
    from kvtier.metrics import LABEL_VALUES, STATES

    mgr = KvTierManager({"host": "127.0.0.1"}, BlockPool(4, 4096, pin=False))
    try:
        seen: dict[tuple[str, str], set[str]] = {}
        for family in mgr.metrics.collect():
            for s in family.samples:
                for label, value in s.labels.items():
                    seen.setdefault((family.name, label), set()).add(value)
    finally:
        mgr.shutdown()
    for (series, label), values in seen.items():
        if label == "state":
            assert values == set(STATES[series]), series
        elif label in LABEL_VALUES:
            assert values <= set(LABEL_VALUES[label]), (series, label, values)
    labels = (DOCS / "metrics.md").read_text(encoding="utf-8")
    for states in STATES.values():
        assert all(f"`{s}`" in labels for s in states)


_DECISION_ROW = re.compile(r"^\| ([A-Z]\d+) \|")
#: "decision C35", "decisions I18, I23", "docs/decisions.md W1, W2 and O11": every id after the word.
_DECISION_CITE = re.compile(r"decisions?(?:\.md)?,? ((?:[A-Z]\d+(?:, | and |/)?)+)")


def test_decision_ids_are_unique_and_every_cited_one_exists() -> None:
    rows = [m.group(1) for line in (DOCS / "decisions.md").read_text(encoding="utf-8").splitlines()
            if (m := _DECISION_ROW.match(line))]
    assert sorted({i for i in rows if rows.count(i) > 1}) == []
    known, unknown = set(rows), []
    for tree in ("docs", "kvtier", "spec", "tools", "tests", "bench", "README.md"):
        root = ROOT / tree
        for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.suffix in (".md", ".py")]:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in _DECISION_CITE.finditer(line):
                    unknown += [f"{path.relative_to(ROOT)}:{n}: {i}" for i in re.findall(r"[A-Z]\d+", m.group(1))
                                if i not in known]
    assert unknown == []

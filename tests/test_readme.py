"""The README's examples stay true: its plan example loads for the model it names."""

import os

from spmdcnn.graph import load_model
from spmdcnn.tiling.plan import parse_plan_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plan_example_fits_its_model():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("```yaml\nformat: spmdcnn-plan/1") + len("```yaml\n")
    example = text[start:text.index("```", start)]
    plan = parse_plan_text(example, load_model(os.path.join(ROOT, "models", "cifar_cnn.yaml")), 64, 2, "README")
    assert plan["conv2.conv"].devices == (1, 0) and plan["fc1"].degrees == (1, 2)
    assert plan["conv1.relu"] == plan["conv1.bn"]          # relu inherits its input's configuration


def _anchors(path):
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    import re
    anchors = set()
    for line in open(path, encoding="utf-8"):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_project_cites_its_own_docs_and_every_cited_section_exists():
    """README, --help texts and docstrings cite docs/ (shipped with the project), never a design document outside
    it; every docs/FILE.md#anchor they cite is a heading of that file."""
    import glob
    import re
    sources = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "spmdcnn", "**", "*.py"), recursive=True) \
        + glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.md"), recursive=True)
    cited = set()
    for path in sources:
        text = open(path, encoding="utf-8").read()
        assert "DESIGN.md" not in text, path
        cited |= {(name, anchor) for name, anchor in re.findall(r"docs/(\w+\.md)#([\w-]+)", text)}
    assert cited
    for name, anchor in cited:
        assert anchor in _anchors(os.path.join(ROOT, "docs", name)), f"docs/{name}#{anchor}"


def _commands(parser, prefix=()):
    """``(words, parser)`` of every command and sub-command of the ``spmdcnn`` parser."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))
            return
    yield prefix, parser


def test_the_command_table_lists_every_option():
    from spmdcnn.cli import build_parser
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `")]
    for words, parser in _commands(build_parser()):
        row = next((r for r in rows if f"spmdcnn {' '.join(words[:1])}" in r and all(w in r for w in words)), None)
        assert row is not None, f"no row for spmdcnn {' '.join(words)}"
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "debug"):
                continue
            assert any(f"{option} " in row or f"{option}]" in row or f"{option}/" in row or f"/{option}" in row
                       for option in action.option_strings), f"spmdcnn {' '.join(words)} {action.option_strings}"

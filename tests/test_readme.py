"""The README's examples stay true: its plan example loads for the model it names, and the output it shows of
commands on a described machine (the analytic model: the same numbers on any computer) is what they print."""

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
            for name, sub in action.choices.items():      # the words a user types (model-import: model import)
                yield from _commands(sub, tuple(sub.prog.split()[1:]))
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


def _example_blocks(text):
    """``(command, lines)`` of every README example of a ``spmdcnn`` command that runs on a described machine (the
    analytic model: the same numbers on any computer), its printed lines as the README shows them."""
    import re
    for block in re.findall(r"```text\n\$ (spmdcnn [^\n]*--machine jobs/machines/[^\n]*)\n(.*?)```", text, re.S):
        yield block[0], block[1].rstrip("\n").splitlines()


def _same(shown, printed):
    """Whether a README line shows a printed line: equal, or a prefix where the README cut it with ``...``, with
    the search's own times left out (they differ from run to run)."""
    import re
    if shown.endswith("...)") or shown.endswith("..."):
        return printed.startswith(shown.rstrip(".)").rstrip("; .("))
    if shown.startswith("search:"):                     # up to its seconds
        return shown.rsplit("; ", 1)[0] == printed.rsplit("; ", 1)[0]
    if re.match(r"\w+\s+\d+\.\d+\s", shown):               # a --compare row: all but its search seconds

        def untimed(line):
            words = line.split()
            last = max(i for i, word in enumerate(words) if re.fullmatch(r"\d+\.\d+", word))
            return words[:last] + words[last + 1:]
        return untimed(shown) == untimed(printed)
    return shown == printed


def test_the_examples_on_described_machines_print_what_the_readme_shows():
    """Every README example of a command on a machine file (the analytic model): each line it shows is a line the
    command prints now, in order ('...' stands for lines left out)."""
    import shlex
    import subprocess
    import sys
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    examples = list(_example_blocks(text))
    assert examples
    for command, shown in examples:
        result = subprocess.run([sys.executable, "-m", "spmdcnn.cli", *shlex.split(command)[1:]], cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        printed = result.stdout.splitlines()
        at = 0
        for line in shown:
            if line == "...":
                continue
            found = next((i for i in range(at, len(printed)) if _same(line, printed[i])), None)
            assert found is not None, f"{command}: the README shows\\n{line}\\nwhich it no longer prints"
            at = found + 1

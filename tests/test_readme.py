"""The README and the docs/ pages stay true: the plan example loads for the model it names, the output they show of
commands on a described machine (the analytic model: the same numbers on any computer) is what those commands
print, the command table lists every option, every cited section exists, the README stays short, and every
command the README asks a reader to run is one the suite (or CI) runs."""

import ast
import glob
import os
import re

from spmdcnn.graph import load_model
from spmdcnn.tiling.plan import parse_plan_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _pages():
    """``(path, text)`` of the README and every docs/ page: where the user documentation lives."""
    return [(path, _read(path)) for path in [README] + DOCS]


def test_the_plan_example_fits_its_model():
    examples = [(path, text[start + len("```yaml\n"):text.index("```", start + len("```yaml\n"))])
                for path, text in _pages()
                for start in [m.start() for m in re.finditer(r"```yaml\nformat: spmdcnn-plan/1", text)]]
    assert examples, "no ```yaml plan example (format: spmdcnn-plan/1) in README.md or docs/"
    model = load_model(os.path.join(ROOT, "models", "cifar_cnn.yaml"))
    for path, example in examples:
        plan = parse_plan_text(example, model, 64, 2, os.path.relpath(path, ROOT))
        assert plan["conv2.conv"].devices == (1, 0) and plan["fc1"].degrees == (1, 2), path
        assert plan["conv1.relu"] == plan["conv1.bn"], path     # relu inherits its input's configuration


def _anchors(path):
    """The anchors of a Markdown file's headings, as GitHub makes them (headings inside code blocks are none)."""
    anchors, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _citations(path, text):
    """``(file, anchor)`` of every section ``path`` cites: ``docs/FILE.md#anchor`` anywhere (from the repository's
    root), and in Markdown the links ``](FILE.md#anchor)``, ``](../x/FILE.md#anchor)`` and ``](#anchor)`` (from the
    page's own folder)."""
    cited = {(os.path.join(ROOT, "docs", name), anchor) for name, anchor in re.findall(r"docs/(\w+\.md)#([\w-]+)", text)}
    if path.endswith(".md"):
        folder = os.path.dirname(path)
        for target, anchor in re.findall(r"\]\(([\w./-]*)#([\w-]+)\)", text):
            cited.add((os.path.normpath(os.path.join(folder, target)) if target else path, anchor))
    return cited


def test_the_project_cites_its_own_docs_and_every_cited_section_exists():
    """README, docs/ pages, --help texts, docstrings and benchmark notes cite docs/ (shipped with the project),
    never a design document or a folder outside it; every section they cite (``docs/FILE.md#anchor``, and the
    Markdown links between pages) is a heading of that file."""
    sources = [README] + DOCS + glob.glob(os.path.join(ROOT, "spmdcnn", "**", "*.py"), recursive=True) \
        + glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.md"), recursive=True)
    cited = set()
    for path in sources:
        text = _read(path)
        assert "DESIGN.md" not in text, path
        if path.endswith(".md") and os.path.dirname(path) in (ROOT, os.path.join(ROOT, "docs")):
            assert "../shared" not in text and "shared/" not in text, path
        cited |= {(path, target, anchor) for target, anchor in _citations(path, text)}
    assert len(cited) > 50, len(cited)
    missing = [f"{os.path.relpath(path, ROOT)}: {os.path.relpath(target, ROOT)}#{anchor}"
               for path, target, anchor in sorted(cited)
               if not os.path.exists(target) or anchor not in _anchors(target)]
    assert not missing, missing


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
    """docs/cli.md's table has a row for every command of ``spmdcnn``, with every option it takes."""
    from spmdcnn.cli import build_parser
    text = _read(os.path.join(ROOT, "docs", "cli.md"))
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
    """``(command, lines)`` of every example of a ``spmdcnn`` command that runs on a described machine (the
    analytic model: the same numbers on any computer), its printed lines as the page shows them."""
    for block in re.findall(r"```text\n\$ (spmdcnn [^\n]*--machine jobs/machines/[^\n]*)\n(.*?)```", text, re.S):
        yield block[0], block[1].rstrip("\n").splitlines()


def _same(shown, printed):
    """Whether a shown line shows a printed line: equal, or a prefix where the page cut it with ``...``, with the
    search's own times left out (they differ from run to run)."""
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


def test_the_examples_on_described_machines_print_what_the_pages_show():
    """Every example in the README or docs/ of a command on a machine file (the analytic model): each line it shows
    is a line the command prints now, in order ('...' stands for lines left out)."""
    import shlex
    import subprocess
    import sys
    examples = [(path, command, shown) for path, text in _pages() for command, shown in _example_blocks(text)]
    assert len(examples) >= 3, examples
    for path, command, shown in examples:
        result = subprocess.run([sys.executable, "-m", "spmdcnn.cli", *shlex.split(command)[1:]], cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        printed = result.stdout.splitlines()
        at = 0
        for line in shown:
            if line == "...":
                continue
            found = next((i for i in range(at, len(printed)) if _same(line, printed[i])), None)
            assert found is not None, f"{os.path.relpath(path, ROOT)}: {command}: shows\n{line}\nwhich it no longer prints"
            at = found + 1


def test_the_readme_is_short_and_holds_no_history_or_build_machine_settings():
    """A newcomer reads the README in ten minutes; dated measurements live in benchmarks/README.md, the rest in
    docs/."""
    text = _read(README)
    assert len(text.splitlines()) <= 350, len(text.splitlines())
    for word in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "this VM", "this project's 2-core VM"):
        assert word not in text, word


# Every command of the README's ```bash blocks (a line, or each part of a line joined by &&), and what runs it: a
# test of the suite (file, name), or CI (.ci/run runs the line as it stands), or, for an install that no test may
# run (tests/test_packaging.py: no test installs anything), the extra it installs, which setup.cfg must declare.
RUN_BY_TESTS = {
    "mpiexec -n 4 spmdcnn train jobs/quickstart.yaml":
        ("tests/test_mpi.py", "test_the_quick_start_learns_the_digits_layer_wise_on_four_ranks"),
    "mpiexec -n 4 spmdcnn train jobs/cosmo_quickstart.yaml":
        ("tests/test_mpi.py", "test_the_volumes_quick_start_learns_the_universes_on_four_ranks"),
    "mpiexec -n 4 spmdcnn train jobs/segmentation_quickstart.yaml":
        ("tests/test_mpi.py", "test_the_segmentation_quick_start_learns_the_shapes_on_four_ranks"),
    **{command: ("tests/test_mpi.py", "test_a_monai_unet_imported_trains_on_two_ranks_and_goes_back_to_monai")
       for command in (
           "spmdcnn model import examples/monai_unet3d.py:unet --input 1 32 32 32 --check -o out/monai_unet3d.yaml",
           "spmdcnn plan out/monai_unet3d.yaml --devices 2 --batch 8 --memory 64MiB -o out/monai_unet3d_plan.yaml",
           "mpiexec -n 2 spmdcnn train jobs/monai_unet3d.yaml",
           "spmdcnn checkpoint export ckpt/monai_unet3d.h5 --torch out/monai_unet3d.pt",
           "python examples/evaluate_monai_unet3d.py out/monai_unet3d.pt data/shapes3d/val.h5")},
}
RUN_BY_CI = {'pip install -q -e ".[test]"', "python -m pytest"}
INSTALLS_ONLY = {'pip install -e ".[mpich]"': "mpich"}


def _readme_commands():
    """``(line, command)`` of every command in the README's ```bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", _read(README), re.S):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                found += [(line, part.strip()) for part in line.split("&&")]
    return found


def _test_source(path, name):
    """The source of test ``name`` in ``path`` and of the module's functions it calls (its helpers), found by
    name in the file's syntax tree."""
    text = _read(os.path.join(ROOT, path))
    functions = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}
    assert name in functions, f"{path} has no test {name}"
    called = {node.func.id for node in ast.walk(functions[name])
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    return "\n".join(ast.get_source_segment(text, functions[f]) for f in [name, *sorted(called & set(functions))])


def test_every_readme_command_is_one_the_suite_runs():
    import configparser
    import shlex
    commands = _readme_commands()
    assert {c for _, c in commands} == set(RUN_BY_TESTS) | RUN_BY_CI | set(INSTALLS_ONLY), commands
    ci = _read(os.path.join(ROOT, ".ci", "run"))
    for line, command in commands:
        if command in RUN_BY_CI:
            assert line in ci.splitlines(), f"{line!r}: .ci/run no longer runs it"
    for command, (path, name) in RUN_BY_TESTS.items():
        source = _test_source(path, name)
        words = shlex.split(command)
        if words[0] == "mpiexec":
            assert words[:3] == ["mpiexec", "-n", words[2]] and words[3] == "spmdcnn", command
            pieces = ("MPIEXEC", f'"-n", "{words[2]}"', *(f'"{word}"' for word in words[4:]))
        else:                           # spmdcnn ..., python FILE ...: the test calls the same words
            assert words[0] in ("spmdcnn", "python"), command
            pieces = tuple(f'"{word}"' for word in words[1:])
        for piece in pieces:
            assert piece in source, f"{path}::{name} does not run {command!r}: no {piece} in its source"
    extras = configparser.ConfigParser()
    extras.read(os.path.join(ROOT, "setup.cfg"))
    for command, extra in INSTALLS_ONLY.items():
        assert extra in extras["options.extras_require"], command

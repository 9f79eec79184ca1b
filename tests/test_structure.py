"""The package's structure (tools/check_structure.py): no import cycles, no oversized modules or functions, the
layering rules kept; and the checker itself finds each kind of problem in a package made for it."""

import importlib.util
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKER = os.path.join(ROOT, "tools", "check_structure.py")


def _checker():
    spec = importlib.util.spec_from_file_location("check_structure", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spmdcnn_keeps_its_structure():
    result = subprocess.run([sys.executable, CHECKER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def _package(root, files):
    for name, source in files.items():
        path = root / "spmdcnn" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return str(root / "spmdcnn")


def test_the_checker_finds_every_kind_of_problem(tmp_path):
    long_function = "def long():\n" + "    x = 1\n" * 81
    package = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def later():\n    from .a import name\n",                     # a lazy import closes a cycle
        "big.py": "x = 1\n" * 501,
        "long.py": long_function,
        "comm/__init__.py": "from .world import World\n",        # its own submodule: no cycle through window
        "comm/world.py": "import mpi4py\nfrom . import transport\nfrom ..ops import window\n",
        "comm/transport.py": "def mpi():\n    from mpi4py import MPI\n",
        "ops/__init__.py": "",
        "ops/window.py": "from .. import backend\nfrom ..comm import World\n",
        "ops/kernels.py": "import numpy\nimport cupy\n\n\ndef later():\n    import cupyx\n",
        "backend.py": "try:\n    import cupyx.scipy\nexcept ImportError:\n    pass\n",
        "tiling/__init__.py": "",
        "tiling/plan.py": "from .. import graph, ops\nfrom ..cli_files import read\nfrom ..io.yamlfile import load\n",
        "graph.py": "",
        "cli_files.py": "",
        "io/__init__.py": "",
        "io/yamlfile.py": "from .. import graph\n",          # io lies below graph
        "runtime/__init__.py": "",
        "runtime/train.py": "def run():\n    from mpi4py import MPI\n",
    })
    order = "(a layer imports only from its own and the layers below it: cli, runtime, planner, cost, comm, tiling, " \
            "graph, ops, io, the rest)"
    assert _checker().findings(package) == [
        "layering spmdcnn.backend: imports cupyx.scipy at module level (CuPy is imported inside functions)",
        "module spmdcnn.big: 501 lines (limit 500)",
        "layering spmdcnn.comm.world: imports spmdcnn.ops.window (spmdcnn.comm imports nothing from spmdcnn.ops)",
        f"layering spmdcnn.io.yamlfile: imports spmdcnn.graph {order}",
        "function spmdcnn.long.long (line 1): 82 lines (limit 80)",
        "layering spmdcnn.ops.kernels: imports cupy at module level (CuPy is imported inside functions)",
        f"layering spmdcnn.ops.window: imports spmdcnn.comm {order}",
        "layering spmdcnn.runtime.train: imports mpi4py (only spmdcnn.comm imports mpi4py)",
        f"layering spmdcnn.tiling.plan: imports spmdcnn.cli_files {order}",
        "import cycle: spmdcnn.a <-> spmdcnn.b",
    ]


def test_the_command_prints_one_line_a_finding_and_fails(tmp_path):
    package = _package(tmp_path, {"__init__.py": "", "a.py": "from . import b\n", "b.py": "from . import a\n"})
    result = subprocess.run([sys.executable, CHECKER, package], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == "import cycle: spmdcnn.a <-> spmdcnn.b\n"
    clean = _package(tmp_path / "clean", {"__init__.py": "", "a.py": "import os\n"})
    result = subprocess.run([sys.executable, CHECKER, clean], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == ""

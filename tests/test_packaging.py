"""What an installed spmdcnn holds: a wheel built from the source tree carries the data the quick start needs."""

import glob
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_wheel_carries_the_digits(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                             str(tmp_path), ROOT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    names = zipfile.ZipFile(glob.glob(str(tmp_path / "spmdcnn-*.whl"))[0]).namelist()
    assert "spmdcnn/io/data/digits.csv.gz" in names and "spmdcnn/io/data/README.md" in names
    assert "spmdcnn/cli_files.py" in names


def test_no_test_installs_anything():
    """The test command leaves the machine as it is: no test runs a package manager (CI's .ci/run installs what
    CI alone needs before it calls the test command)."""
    import io
    import tokenize
    installers = {"apt-get", "apt", "yum", "dnf", "conda", "install", "pip3"}
    found = []
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True):
        if os.path.samefile(path, __file__):        # the names above
            continue
        with open(path, encoding="utf-8") as handle:
            for token in tokenize.generate_tokens(io.StringIO(handle.read()).readline):
                if token.type == tokenize.STRING and token.string.strip("\"'") in installers:
                    found.append(f"{os.path.relpath(path, ROOT)}:{token.start[0]}: {token.string}")
    assert not found, found

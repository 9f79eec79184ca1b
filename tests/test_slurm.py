"""The Slurm batch scripts (jobs/slurm/): the quick start's runs for real on a one-node Slurm started here, the
16-GPU ones are checked for what can be checked without GPUs (their shell, their layout, their jobs and plans).

The one-node Slurm is Debian's slurm-wlm, where it is installed (the tests install nothing; `.ci/run` installs it
in CI and sets SPMDCNN_REQUIRE_SLURM, which makes a missing Slurm a failure instead of a skip): munged, slurmctld
and slurmd on this machine, from a configuration written for the test in its own temporary folder (its own ports,
state and spool folders, and its own munge key and socket, so that neither a system munged nor a dead one's socket
left in /run/munge matters), stopped and reaped at the end.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from spmdcnn.io.job import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "jobs", "slurm")
SPMDCNN = [sys.executable, "-m", "spmdcnn.cli"]


def _sbatch_options(path):
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", open(path, encoding="utf-8").read(), re.MULTILINE))


@pytest.mark.parametrize("model", ["alexnet", "vgg16", "inception_v3"])
def test_the_16_gpu_scripts_run_their_job_on_4_nodes_of_4(model):
    script = os.path.join(SCRIPTS, f"{model}-16gpu.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    options = _sbatch_options(script)
    assert (options["nodes"], options["ntasks-per-node"], options["gpus-per-node"]) == ("4", "4", "4")
    assert options["signal"].startswith("USR1@") and "requeue" in open(script).read()
    command = next(line for line in open(script).read().splitlines() if line.startswith("srun "))
    assert f"spmdcnn train jobs/imagenet/{model}.yaml" in command
    assert 'scontrol requeue "$SLURM_JOB_ID"' in open(script).read()     # after a stop on a signal
    job = load_job(os.path.join(ROOT, "jobs", "imagenet", f"{model}.yaml"))
    assert job["batch_size"] == 32 * 16 and job["plan"] == "auto" and job["backend"] == "cupy"
    assert job["checkpoint"]["keep"] > 1 and job["resume"] == "auto" and job["data"]["val"]
    result = subprocess.run([*SPMDCNN, "plan", job["model"], "--devices", "16", "--batch", str(job["batch_size"]),
                             "--machine", job["machine"]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "predicted iteration" in result.stdout, result.stderr


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


INSTALL = "apt-get install slurm-wlm munge"     # Debian's packages; .ci/run runs this (as root) before the tests


def _missing_slurm():
    """Why there is no Slurm to start here (the tools missing, and the command that installs them), or None.
    The tests never install anything: the machine they run on is left as it is."""
    needed = ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "munged")
    missing = [tool for tool in needed if not shutil.which(tool)]
    if not missing:
        return None
    return f"{', '.join(missing)} not found; install Slurm with `{INSTALL}` (as root; CI's .ci/run does)"


@pytest.fixture
def one_node_slurm(tmp_path):
    """A one-node Slurm cluster on this machine; yields the environment that points its commands at it."""
    why = _missing_slurm()
    if why and os.environ.get("SPMDCNN_REQUIRE_SLURM"):      # CI installs Slurm: a skip there would hide a failure
        pytest.fail(f"SPMDCNN_REQUIRE_SLURM is set, but {why}")
    if why:
        pytest.skip(f"no one-node Slurm here: {why}")
    host = socket.gethostname()
    folder = tmp_path / "slurm"
    for sub in ("state", "spool", "log", "munge"):
        (folder / sub).mkdir(parents=True)
    munge = folder / "munge"
    (munge / "munge.key").write_bytes(os.urandom(1024))
    (munge / "munge.key").chmod(0o600)
    ctld, slurmd_port = _free_ports(2)
    cpus = os.cpu_count() or 1
    config = folder / "slurm.conf"
    config.write_text(f"""ClusterName=spmdcnntest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldPort={ctld}
SlurmdPort={slurmd_port}
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
    env = {**os.environ, "SLURM_CONF": str(config)}
    daemons = [subprocess.Popen(["munged", "--foreground", "--force", f"--socket={munge}/munge.socket",
                                 f"--key-file={munge}/munge.key", f"--seed-file={munge}/munged.seed",
                                 f"--pid-file={munge}/munged.pid", f"--log-file={folder}/log/munged.log"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 30
    while not (munge / "munge.socket").exists() and daemons[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    daemons += [subprocess.Popen([tool, "-D", "-f", str(config)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for tool in ("slurmctld", "slurmd")]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True,
                                   timeout=60).stdout
            if state.strip() in ("idle", "mix", "alloc"):
                break
            time.sleep(0.5)
        else:
            logs = "".join(open(folder / "log" / name).read()[-800:] for name in os.listdir(folder / "log"))
            pytest.fail(f"the one-node Slurm did not come up: sinfo says {state!r}\n{logs}")
        yield env
    finally:
        for process in reversed(daemons):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ended(job, env, within):
    """``scontrol``'s one line on ``job`` once it has ended (asked every half second: ``sbatch --wait`` asks ever
    less often, and found a 15-second job ended half a minute late)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True,
                               timeout=60).stdout
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)\b",
                     state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job} had not ended after {within} s: {state}")


@pytest.mark.timeout(1200)
def test_the_quick_start_batch_script_on_a_one_node_slurm(one_node_slurm, tmp_path):
    sets = [f"data.path={tmp_path / 'digits' / 'train.h5'}", f"data.val={tmp_path / 'digits' / 'val.h5'}",
            f"checkpoint.path={tmp_path / 'q.h5'}", f"log.metrics={tmp_path / 'q.jsonl'}"]
    output = tmp_path / "slurm-%j.out"
    result = subprocess.run(["sbatch", "--parsable", "--overcommit", f"--output={output}", "--chdir", ROOT,
                             os.path.join(SCRIPTS, "quickstart.sbatch"), *[x for s in sets for x in ("--set", s)]],
                            env={**one_node_slurm, "SPMDCNN_CACHE": str(tmp_path / "cache")},
                            capture_output=True, text=True, timeout=60)
    job = re.match(r"(\d+)", result.stdout)
    assert result.returncode == 0 and job, result.stdout + result.stderr
    state = _ended(job.group(1), one_node_slurm, within=1100)
    log = open(str(output).replace("%j", job.group(1)), encoding="utf-8").read()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, log + state
    assert "4 ranks; plan auto (" in log and "predicted" in log
    accuracy = [float(x) for x in re.findall(r"val acc (\d\.\d+)", log)]
    assert len(accuracy) == 4 and accuracy[-1] >= 0.97, log
    assert (tmp_path / "q.h5").exists()


@pytest.mark.parametrize("script", ["quickstart", "alexnet-16gpu", "vgg16-16gpu", "inception_v3-16gpu"])
def test_the_scripts_run_as_written_under_a_stand_in_srun_and_a_named_virtual_environment(tmp_path, script):
    """Each script as bash runs it, with a stand-in ``srun`` (it runs the command it is given) and a stand-in
    virtual environment named by SPMDCNN_VENV whose ``spmdcnn`` says what it was asked: the script activates the
    environment and passes its arguments on."""
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (venv / "bin" / "spmdcnn").write_text('#!/bin/bash\necho "spmdcnn from the venv: $*"\n')
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    for tool in (bin_dir / "srun", venv / "bin" / "spmdcnn"):
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPMDCNN_VENV": str(venv),
           "SLURM_SUBMIT_DIR": ROOT}
    result = subprocess.run(["bash", os.path.join(SCRIPTS, f"{script}.sbatch"), "--set", "epochs=1"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    job = "jobs/quickstart.yaml" if script == "quickstart" else f"jobs/imagenet/{script.split('-')[0]}.yaml"
    assert result.stdout.strip() == f"spmdcnn from the venv: train {job} --set epochs=1"

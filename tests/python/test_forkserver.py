"""tests/python/forkserver.py: a command forked from the server behaves as the same command started
by `subprocess` (argv, __main__, sys.path, environment, working directory, streams, exit codes,
uncaught exceptions, timeouts), and a command it cannot fork faithfully runs as a real process."""
import os
import subprocess
import sys
import textwrap

import pytest

import forkserver

SCRIPT = textwrap.dedent("""
    import json, os, sys
    preloaded = "torch_ort" in sys.modules  # only in a fork of the server
    import torch
    class Point:  # picklable from __main__, as in a script started by python
        pass
    import pickle
    pickle.loads(pickle.dumps(Point()))
    print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                      "var": os.environ.get("FORKSERVER_TEST"), "threads": torch.get_num_threads(),
                      "preloaded": preloaded}))
    print("to stderr", file=sys.stderr)
    open(sys.argv[1], "w").write("unflushed at exit")  # flushed when the file object goes, as python does
    sys.exit(int(sys.argv[2]))
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return str(path)


def both(cmd, **kw):
    forked = forkserver.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    real = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    return forked, real


def test_a_forked_script_sees_what_a_new_process_sees(script, tmp_path):
    import json
    env = dict(os.environ, FORKSERVER_TEST="yes", OMP_NUM_THREADS="1")
    forked, real = both([sys.executable, script, str(tmp_path / "f"), "3"], env=env, cwd=str(tmp_path))
    assert (forked.returncode, real.returncode) == (3, 3), forked.stderr + real.stderr
    a, b = json.loads(forked.stdout), json.loads(real.stdout)
    assert (a.pop("preloaded"), b.pop("preloaded")) == (True, False)  # forked, then really started
    assert a == b == {"name": "__main__", "argv": [script, str(tmp_path / "f"), "3"], "path0": str(tmp_path),
                      "cwd": str(tmp_path), "var": "yes", "threads": 1}
    assert forked.stderr == real.stderr == "to stderr\n"
    assert (tmp_path / "f").read_text() == "unflushed at exit"
    assert forkserver.forkable([sys.executable, script], env)


def test_dash_c_and_dash_m_and_uncaught_exceptions_as_python_runs_them(tmp_path):
    forked, real = both([sys.executable, "-c", "import sys; print(sys.argv, repr(sys.path[0]), __name__)", "x"])
    assert forked.stdout == real.stdout == "['-c', 'x'] '' __main__\n"
    forked, real = both([sys.executable, "-m", "json.tool", "--help"])
    assert forked.returncode == real.returncode == 0 and forked.stdout == real.stdout
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return 1 / 0\nf()\n")
    forked, real = both([sys.executable, str(bad)])
    assert forked.returncode == real.returncode == 1
    assert forked.stderr == real.stderr and "forkserver" not in forked.stderr
    assert forked.stderr.startswith("Traceback") and "ZeroDivisionError" in forked.stderr


def test_a_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    proc = forkserver.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(timeout=10) == -9


def test_what_a_fork_cannot_reproduce_runs_as_a_real_process():
    """Variables read when torch or Python start, and other interpreters or options."""
    cmd = [sys.executable, "-c", "pass"]
    assert forkserver.forkable(cmd, None)
    for var in ("PYTHONPATH", "OMP_WAIT_POLICY", "TORCH_LOGS", "LD_PRELOAD", "HF_HOME"):
        assert not forkserver.forkable(cmd, dict(os.environ, **{var: "changed-for-the-test"})), var
    assert forkserver.forkable(cmd, dict(os.environ, OMP_NUM_THREADS="1", ORTMODULE_LOG_LEVEL="INFO"))
    assert not forkserver.forkable(["python3", "-c", "pass"], None)
    assert not forkserver.forkable([sys.executable, "-X", "importtime", "-c", "pass"], None)
    done = forkserver.run([sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"],
                          env=dict(os.environ, PYTHONPATH="/nowhere"), capture_output=True, text=True)
    assert done.stdout == "/nowhere\n"

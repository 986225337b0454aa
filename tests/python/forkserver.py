"""Python subprocesses for the tests without paying their imports each time.

A test that runs an example or a training worker starts a new Python process, and on a 2-core
machine such a process spends 5 to 12 seconds importing torch, torch_ort and transformers before
it does anything the test is about. Here one server process per pytest worker does those imports
once, runs nothing else (no operator, so no OpenMP thread pool that a fork could break), and forks
a child for each command: the child takes the command's argv, environment, working directory and
standard streams, and runs the script or module as `python` would, as `__main__`, exiting through
the interpreter's own shutdown.

`run` and `Popen` take the arguments of their `subprocess` namesakes that the tests use. A command
that is not `sys.executable SCRIPT ...` or `sys.executable -m MODULE ...`, or whose environment
differs from the server's in a variable read at import time (PYTHON*, LD_*, OpenMP and MKL
settings but OMP_NUM_THREADS, TORCH*, CUDA*, HF_*), runs as a real subprocess, as does every
command when TORCH_ORT_TEST_FORK=0.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import types

# What the examples and workers import (those not installed are left out).
PRELOAD = ("torch", "torch.distributed", "torch.export", "torch._dynamo", "torch.onnx", "torch_ort",
           "transformers", "transformers.models.gpt2.modeling_gpt2", "transformers.models.bert.modeling_bert",
           "lightning", "sklearn")
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "TORCH", "CUDA", "HF_",
                        "TRANSFORMERS", "PL_", "LIGHTNING")
_BASE_ENV = dict(os.environ)  # the pytest worker's, before any test changes it: the server's


def _import_time_keys(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_PREFIXES) and k not in ("OMP_NUM_THREADS", "TORCH_ORT_TEST_FORK")}


def forkable(cmd, env: dict | None) -> bool:
    """Whether `cmd` with `env` (None: this process's) would run forked from the server (which
    this starts, if it is not running: its environment after its imports decides)."""
    if os.environ.get("TORCH_ORT_TEST_FORK", "1") == "0" or not isinstance(cmd, (list, tuple)):
        return False
    if len(cmd) < 2 or cmd[0] != sys.executable or (cmd[1].startswith("-") and cmd[1] not in ("-m", "-c")):
        return False
    if cmd[1] in ("-m", "-c") and len(cmd) < 3:
        return False
    # Each such variable as the server started, or as its imports left it (scikit-learn sets KMP_*,
    # transformers TORCHINDUCTOR_CACHE_DIR: a new process importing them would too).
    before, after = _import_time_keys(_BASE_ENV), _get_server().import_time_env
    wanted = _import_time_keys(os.environ if env is None else env)
    return all(wanted.get(k) in (before.get(k), after.get(k)) for k in {*before, *after, *wanted})


# --- the client side (in the pytest worker) --------------------------------------------------------
class _Server:
    def __init__(self):
        # A socket's path has at most 107 bytes: a long TMPDIR gives way to /tmp.
        self.dir = tempfile.mkdtemp(prefix="torch_ort_forkserver.")
        if len(self.dir) > 80:
            os.rmdir(self.dir)
            self.dir = tempfile.mkdtemp(prefix="torch_ort_forkserver.", dir="/tmp")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_BASE_ENV, text=True)
        line = self.proc.stdout.readline()  # "ready" and its environment, once the imports are done
        if not line.startswith("ready "):
            raise RuntimeError(f"the fork server did not start (exit {self.proc.wait()}): {line!r}")
        self.import_time_env = json.loads(line[len("ready "):])

    def spawn(self, cmd, env, cwd, fds) -> tuple[socket.socket, int]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.path)
        request = json.dumps({"argv": list(cmd[1:]), "env": env, "cwd": cwd}).encode()
        socket.send_fds(conn, [request], fds)
        reply = _read_line(conn)
        if reply is None:
            raise RuntimeError("the fork server closed the connection before starting the command")
        return conn, json.loads(reply)["pid"]


_server: _Server | None = None


def _get_server() -> _Server:
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
    return _server


def _read_line(conn: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return data


def _fd(stream, default_fd: int, mode: str):
    """A descriptor for one of the child's standard streams, and what to close after sending it."""
    if stream is None:
        return default_fd, None
    if stream == subprocess.DEVNULL:
        f = open(os.devnull, mode)
        return f.fileno(), f
    if isinstance(stream, int):
        return stream, None
    return stream.fileno(), None


class Popen:
    """subprocess.Popen for `sys.executable ...` commands (stdin, stdout, stderr: None, DEVNULL, a
    descriptor or a file), forked from the server where the command allows it."""

    def __init__(self, cmd, env=None, cwd=None, stdin=None, stdout=None, stderr=None, text=None):
        self.args = cmd
        self.returncode = None
        self._proc = None
        if not forkable(cmd, env):
            self._proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text)
            self.pid = self._proc.pid
            return
        opened = []
        fds = []
        for stream, default, mode in ((stdin, 0, "r"), (stdout, 1, "w"), (stderr, 2, "w")):
            fd, f = _fd(stream, default, mode)
            fds.append(fd)
            if f is not None:
                opened.append(f)
        try:
            self._conn, self.pid = _get_server().spawn(cmd, dict(os.environ if env is None else env),
                                                       os.path.abspath(cwd or os.getcwd()), fds)
        finally:
            for f in opened:
                f.close()

    def poll(self):
        if self._proc is not None:
            self.returncode = self._proc.poll()
        elif self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def _finish(self):
        reply = _read_line(self._conn)
        self._conn.close()
        self.returncode = json.loads(reply)["returncode"] if reply else -signal.SIGKILL

    def wait(self, timeout=None):
        if self._proc is not None:
            self.returncode = self._proc.wait(timeout)
            return self.returncode
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def kill(self):
        if self._proc is not None:
            self._proc.kill()
        elif self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run(cmd, capture_output=False, text=None, timeout=None, env=None, cwd=None, check=False, stdout=None,
        stderr=None):
    """subprocess.run for `sys.executable ...` commands; output captured through files (a child
    that writes much cannot block on a full pipe)."""
    if not forkable(cmd, env):
        return subprocess.run(cmd, capture_output=capture_output, text=text, timeout=timeout, env=env, cwd=cwd,
                              check=check, stdout=stdout, stderr=stderr)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if capture_output:
            stdout, stderr = out, err
        proc = Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        captured = []
        for f, used in ((out, stdout is out), (err, stderr is err)):
            f.seek(0)
            data = f.read() if used else None
            captured.append(data.decode() if text and data is not None else data)
    done = subprocess.CompletedProcess(cmd, code, *captured)
    if check:
        done.check_returncode()
    return done


# --- the server side -----------------------------------------------------------------------------
def _run_as_main(filename: str, source) -> None:
    main = types.ModuleType("__main__")
    if filename != "<string>":
        main.__file__ = filename
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


def _child(request: dict, fds: list[int]) -> int:
    """In the forked child: become the command, run it as `python` would, return its exit code."""
    import random
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()  # a new process draws new random state; a fork would repeat the server's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "OMP_NUM_THREADS" in os.environ:  # read by OpenMP when it was loaded, in the server
        import torch
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    argv = request["argv"]
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            _run_as_main("<string>", argv[1])
        elif argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1], alter_argv=True)  # what `python -m` calls
        else:
            path = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(path)
            with open(path, "rb") as f:
                _run_as_main(path, f.read())
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:  # as the interpreter reports an uncaught exception
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # the command's frames only
            tb = tb.tb_next
        sys.excepthook(type(e), e, e.with_traceback(tb).__traceback__)
        return 1
    return 0


def _serve(path: str) -> int | None:
    """Returns only in a forked child, with the command's exit code."""
    import importlib.util
    for name in PRELOAD:
        if importlib.util.find_spec(name.partition(".")[0]) is not None:
            __import__(name)
    import gc
    gc.collect()
    gc.freeze()  # a child's collections then leave the imported objects, and the pages they share, alone
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    print("ready", json.dumps(_import_time_keys(dict(os.environ))), flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        readable = select.select([listener, sys.stdin], [], [], 0.05)[0]
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):  # the pytest worker is gone
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
            return None
        if listener in readable:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                return _child(json.loads(msg), fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:  # the client is gone
                pass
            conn.close()


def _exit(code: int) -> None:
    """The interpreter's exit without its teardown of every module, which in a child writes to,
    and so copies, most of the pages it shares with the server: exit handlers, then every open
    file flushed (as their deallocation would), then the exit itself."""
    import atexit
    import gc
    import io
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        if isinstance(obj, (io.BufferedIOBase, io.TextIOBase)) and not obj.closed and obj.writable():
            try:
                obj.flush()
            except Exception:  # noqa: BLE001 - a broken stream must not change the exit code
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


if __name__ == "__main__":
    code = _serve(sys.argv[1])
    _exit(0 if code is None else code)  # the server too: nothing of its teardown is needed

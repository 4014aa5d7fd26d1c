"""rawflux-launch: run a script on every GPU of this node, or on an emulated node (N ranks, 1 GPU).

    rawflux-launch [-n N] script.py args...          mpirun -np N (default: the local GPU count)
    rawflux-launch --emulate N script.py args...     N ranks on one GPU under a private MPS daemon
    rawflux-launch --emulate 2 -m pytest --with-mpi tests/mpi
    python -m rawflux.launch ...                     the same

Options (before the program): -n/--np N, --emulate N, --device D (the GPU of the emulated node),
--oversubscribe (more ranks than cores; implied by --emulate and when N > cores),
--mpirun-arg ARG (repeatable), --dry-run (print the command, run nothing), -- (ends options).
The program is ``script.py ...`` or ``-m module ...`` (run with this Python) or any executable.

The emulated node: an MPS control daemon is started with its pipe and log folders in a fresh
temporary folder (CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY), so it neither meets nor
disturbs any other MPS daemon; every rank is capped at floor(100/N) % of the SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) so all N ranks' kernels are resident at once, which
cross-rank spin-waits need. MPS is always stopped afterwards (``echo quit |
nvidia-cuda-mps-control``): on success, failure, Ctrl-C and SIGTERM alike.

Switches (rawflux/env.py): RAWFLUX_MPIRUN, RAWFLUX_MPIRUN_ARGS, RAWFLUX_MPS_CONTROL.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import env

USAGE = __doc__.split("\n\n")[1]


class LaunchError(RuntimeError):
    pass


@dataclass
class Options:
    np: int | None = None
    emulate: int | None = None
    device: str | None = None
    mpirun_args: list[str] = field(default_factory=list)
    dry_run: bool = False
    oversubscribe: bool = False
    program: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> Options:
    """Our options come first; the first word that is not one of them starts the program."""
    o = Options()
    i = 0

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(argv):
            raise LaunchError(f"{flag} needs a value")
        i += 1
        return argv[i]

    def count(flag: str, raw: str) -> int:
        try:
            n = int(raw)
        except ValueError:
            raise LaunchError(f"{flag} needs a number of ranks, got {raw!r}") from None
        if n < 1:
            raise LaunchError(f"{flag} needs at least 1 rank, got {n}")
        return n

    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            raise SystemExit(print(__doc__) or 0)
        if a == "--":
            i += 1
            break
        if a in ("-n", "-np", "--np"):
            o.np = count(a, value(a))
        elif a.startswith("--np="):
            o.np = count("--np", a.split("=", 1)[1])
        elif a == "--emulate":
            o.emulate = count(a, value(a))
        elif a.startswith("--emulate="):
            o.emulate = count("--emulate", a.split("=", 1)[1])
        elif a == "--device":
            o.device = value(a)
        elif a == "--mpirun-arg":
            o.mpirun_args.append(value(a))
        elif a == "--dry-run":
            o.dry_run = True
        elif a == "--oversubscribe":
            o.oversubscribe = True
        else:
            break
        i += 1
    o.program = list(argv[i:])
    if not o.program:
        raise LaunchError("no program given\n" + USAGE)
    if o.emulate is not None and o.np is not None and o.np != o.emulate:
        raise LaunchError(f"-n {o.np} and --emulate {o.emulate} disagree; --emulate N alone sets the rank count")
    return o


def program_command(program: list[str]) -> list[str]:
    """``script.py args`` and ``-m module args`` run under this Python; anything else as is."""
    if program[0] == "-m" or program[0].endswith(".py"):
        return [sys.executable, *program]
    return list(program)


def local_gpu_count() -> int:
    visible = env.cuda_visible_devices()
    if visible is not None:
        return len(visible)
    smi = shutil.which("nvidia-smi")
    found = "nvidia-smi is not on the PATH"
    if smi:
        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
            if n:
                return n
            said = (r.stdout + r.stderr).strip().splitlines()
            found = f"nvidia-smi -L lists none ({said[0].strip() if said else f'exit {r.returncode}'})"
        except (OSError, subprocess.SubprocessError) as e:
            found = f"nvidia-smi -L failed ({e})"
    # No GPU to count: the ranks would only fail, each with its own traceback.
    raise LaunchError(f"no NVIDIA GPU found on this node ({found}, CUDA_VISIBLE_DEVICES is unset): rawflux needs NVIDIA "
                      "Hopper GPUs, one rank per GPU; on a GPU node without nvidia-smi, pass -n N")


def mpi_flavour(mpirun: str) -> str:
    """'openmpi', 'mpich' or 'unknown', from ``mpirun --version``."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return "mpich"
    return "unknown"


def build_command(o: Options, *, nranks: int, extra_env: dict[str, str], flavour: str, is_root: bool,
                  cpus: int) -> tuple[list[str], dict[str, str]]:
    """The launcher command line and the variables to add to its environment."""
    mpirun = env.mpirun()
    cmd = [mpirun, "-np", str(nranks)]
    add_env = dict(extra_env)
    if flavour == "openmpi":
        if is_root:
            cmd.append("--allow-run-as-root")
            add_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if o.emulate is not None or o.oversubscribe or nranks > cpus:
            # more ranks than cores (the emulated node, small machines): allow it, and do not
            # pin ranks to cores (binding would refuse to oversubscribe)
            cmd += ["--oversubscribe", "--bind-to", "none"]
        for name in sorted(add_env):
            cmd += ["-x", name]  # Open MPI forwards these explicitly (also to remote daemons)
        cmd += ["-x", "PYTHONPATH"] if "PYTHONPATH" in os.environ or "PYTHONPATH" in add_env else []
    elif flavour == "mpich":
        for name, val in sorted(add_env.items()):
            cmd += ["-genv", name, val]
    cmd += env.mpirun_extra_args() + o.mpirun_args
    cmd += program_command(o.program)
    return cmd, add_env


def emulation_env(n: int, device: str, pipe_dir: str, log_dir: str) -> dict[str, str]:
    return {
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, 100 // n)),
        "CUDA_VISIBLE_DEVICES": device,
        "RAWFLUX_EMULATED_NODE": "1",
    }


class _Terminated(Exception):
    pass


@contextmanager
def _signals_raise():
    """SIGTERM / SIGHUP become an exception, so the finally blocks (stopping MPS) run."""
    def handler(signum, frame):  # noqa: ARG001
        raise _Terminated(f"signal {signum}")

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            old[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _mps_pid(pipe_dir: str) -> int | None:
    for name in ("nvidia-cuda-mps-control.pid", "control.pid"):
        p = os.path.join(pipe_dir, name)
        try:
            with open(p) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@contextmanager
def mps_daemon(n: int, device: str):
    """Start a private MPS control daemon for an N-rank emulated node; always stop it.

    The daemon runs in the foreground (``-f``) as this launcher's child, in its own session (a
    Ctrl-C meant for the ranks does not hit it), so it is stopped by ``quit`` and then awaited by
    its process id. Drivers without ``-f`` fall back to ``-d`` (the daemon forks away)."""
    control = env.mps_control()
    exe = shutil.which(control) or (control if os.path.isfile(control) else None)
    if exe is None:
        raise LaunchError(f"--emulate needs the MPS control binary ({control}); it is not on the PATH "
                          "(set RAWFLUX_MPS_CONTROL to its path)")
    root = tempfile.mkdtemp(prefix="rawflux-mps-")
    pipe_dir, log_dir = os.path.join(root, "pipe"), os.path.join(root, "log")
    os.makedirs(pipe_dir)
    os.makedirs(log_dir)
    mps_env = emulation_env(n, device, pipe_dir, log_dir)
    daemon_env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir, CUDA_MPS_LOG_DIRECTORY=log_dir)
    # The daemon sees every GPU, so a client's CUDA_VISIBLE_DEVICES=<device> means the same GPU
    # to the client and to the MPS server.
    daemon_env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = None
    started = False
    try:
        out = open(os.path.join(log_dir, "rawflux-launch-daemon.out"), "w")
        try:
            proc = subprocess.Popen([exe, "-f"], env=daemon_env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        started = _wait_ready(proc, pipe_dir, 15.0)
        if not started:
            if proc.poll() is None:  # up but silent: stop it before trying the daemon mode
                _stop_mps(exe, daemon_env, pipe_dir, proc)
            proc = None
            r = subprocess.run([exe, "-d"], env=daemon_env, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise LaunchError(f"could not start MPS: {exe} -f did not come up and {exe} -d failed "
                                  f"({r.returncode}): {r.stdout}{r.stderr}")
            started = True
        print(f"[rawflux-launch] MPS daemon up (pipe {pipe_dir}); {n} ranks on GPU {device}, "
              f"{mps_env['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']}% of the SMs each", file=sys.stderr, flush=True)
        yield mps_env
    finally:
        if started:
            _stop_mps(exe, daemon_env, pipe_dir, proc)
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(proc, pipe_dir: str, timeout_s: float) -> bool:
    """True once the foreground daemon has made its control pipe; False if it exited first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if os.listdir(pipe_dir):  # the daemon made its control pipe (and lock)
                time.sleep(0.1)
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


_MPS_QUIT_TIMEOUT_S = 20.0  # 'quit' waits for clients; killed clients can make it hang (seen on H200)


def _stop_mps(exe: str, daemon_env: dict, pipe_dir: str, proc=None) -> None:
    """quit, then make sure: the foreground daemon is awaited by its process, and if it does not
    go, its process group (the daemon and the MPS server it spawned; start_new_session made the
    daemon the group's leader) is terminated by that group id. Nothing is looked up by name."""
    pid = proc.pid if proc is not None else _mps_pid(pipe_dir)
    quit_ok = False
    try:
        r = subprocess.run([exe], input="quit\n", env=daemon_env, capture_output=True, text=True,
                           timeout=_MPS_QUIT_TIMEOUT_S)
        quit_ok = r.returncode == 0
        if not quit_ok:
            print(f"[rawflux-launch] 'echo quit | {exe}' returned {r.returncode}: {r.stdout}{r.stderr}",
                  file=sys.stderr, flush=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"[rawflux-launch] MPS did not take 'quit' ({e}); stopping it by process id", file=sys.stderr, flush=True)
    if proc is not None:
        try:
            proc.wait(timeout=10 if quit_ok else 1)
        except subprocess.TimeoutExpired:
            print(f"[rawflux-launch] MPS control daemon {proc.pid} still up after quit; terminating its process group",
                  file=sys.stderr, flush=True)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _reap_group(proc.pid)
    elif pid is not None:
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            print(f"[rawflux-launch] MPS control daemon {pid} still up after quit; sending SIGTERM",
                  file=sys.stderr, flush=True)
            try:
                os.kill(pid, signal.SIGTERM)  # the daemon this launcher started, by its id
            except OSError:
                pass
    print("[rawflux-launch] MPS daemon stopped", file=sys.stderr, flush=True)


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the process group this launcher created for the daemon; False if it is empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _reap_group(pgid: int, grace_s: float = 5.0) -> None:
    """Once the daemon is gone, give what is left of its group (the MPS server) grace_s to exit,
    then terminate it."""
    deadline = time.monotonic() + grace_s
    while _signal_group(pgid, 0):
        if time.monotonic() > deadline:
            print(f"[rawflux-launch] MPS server (process group {pgid}) outlived its daemon; terminating it",
                  file=sys.stderr, flush=True)
            _signal_group(pgid, signal.SIGTERM)
            time.sleep(2.0)
            _signal_group(pgid, signal.SIGKILL)
            return
        time.sleep(0.1)


def _run(cmd: list[str], add_env: dict[str, str]) -> int:
    child_env = dict(os.environ, **add_env)
    proc = subprocess.Popen(cmd, env=child_env)
    try:
        return proc.wait()
    except BaseException:
        # Ctrl-C reached mpirun too (same process group); give it time to take its ranks down.
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except OSError:
            pass
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        o = parse_args(argv)
        mpirun = env.mpirun()
        if shutil.which(mpirun) is None and not os.path.isfile(mpirun):
            raise LaunchError(f"the MPI launcher '{mpirun}' is not on the PATH (install Open MPI, e.g. "
                              "pip install 'rawflux[mpi]', or set RAWFLUX_MPIRUN)")
        flavour = mpi_flavour(mpirun)
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        cpus = os.cpu_count() or 1
        if o.emulate is None:
            n = o.np if o.np is not None else local_gpu_count()
            cmd, add_env = build_command(o, nranks=n, extra_env={}, flavour=flavour, is_root=is_root, cpus=cpus)
            if o.dry_run:
                print(" ".join(cmd))
                return 0
            with _signals_raise():
                return _run(cmd, add_env)
        n = o.emulate
        visible = env.cuda_visible_devices()
        device = o.device if o.device is not None else (visible[0] if visible else "0")
        if o.dry_run:
            fake = emulation_env(n, device, "<pipe>", "<log>")
            cmd, _ = build_command(o, nranks=n, extra_env=fake, flavour=flavour, is_root=is_root, cpus=cpus)
            print(" ".join(f"{k}={v}" for k, v in fake.items()) + " " + " ".join(cmd))
            return 0
        with _signals_raise(), mps_daemon(n, device) as mps_env:
            cmd, add_env = build_command(o, nranks=n, extra_env=mps_env, flavour=flavour, is_root=is_root, cpus=cpus)
            return _run(cmd, add_env)
    except LaunchError as e:
        print(f"rawflux-launch: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated):
        print("rawflux-launch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""rawflux-launch on the CPU: argument parsing, the mpirun command it builds, and the MPS daemon
lifecycle of --emulate with stand-in binaries (MPS must be stopped on success, on failure and on
SIGTERM)."""
from __future__ import annotations

import os
import stat
import textwrap
import time

import pytest

from rawflux import launch


def _script(path, body):
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    # foreground mode (-f): make the control pipe, run until a quit arrives; -d: fork away
    mps = _script(tmp_path / "mps-control", f"""
        pipe="$CUDA_MPS_PIPE_DIRECTORY"
        if [ "$1" = "-f" ]; then
            if [ -n "$FAKE_NO_FOREGROUND" ]; then exit 1; fi
            echo "start $pipe" >> {log}; touch "$pipe/control"
            if [ -n "$FAKE_SERVER_LINGERS" ]; then (trap '' TERM; sleep 600) & fi
            if [ -n "$FAKE_QUIT_HANGS" ]; then sleep 600; fi
            while [ ! -f "$pipe/quit" ]; do sleep 0.05; done
            echo "exit $pipe" >> {log}; exit 0
        fi
        if [ "$1" = "-d" ]; then echo "start-d $pipe" >> {log}; exit 0; fi
        read cmd; echo "$cmd $pipe" >> {log}
        if [ -n "$FAKE_QUIT_HANGS" ]; then exec sleep 600; fi
        touch "$pipe/quit"
    """)
    mpirun = _script(tmp_path / "mpirun", f"""
        if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 5.0.0"; exit 0; fi
        echo "mpirun $* pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE cvd=$CUDA_VISIBLE_DEVICES emu=$RAWFLUX_EMULATED_NODE" >> {log}
        if [ -n "$FAKE_KILL_PARENT" ]; then kill -TERM $PPID; sleep 1; fi
        exit ${{FAKE_RC:-0}}
    """)
    monkeypatch.setenv("RAWFLUX_MPS_CONTROL", mps)
    monkeypatch.setenv("RAWFLUX_MPIRUN", mpirun)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return log


def test_parse_args():
    o = launch.parse_args(["-n", "4", "--mpirun-arg", "--tag-output", "train.py", "-n", "7"])
    assert (o.np, o.emulate, o.mpirun_args, o.program) == (4, None, ["--tag-output"], ["train.py", "-n", "7"])
    o = launch.parse_args(["--emulate", "8", "-m", "pytest", "-q"])
    assert (o.emulate, o.program) == (8, ["-m", "pytest", "-q"])
    o = launch.parse_args(["-n", "2", "--oversubscribe", "--", "python", "-c", "1"])
    assert o.oversubscribe and o.program == ["python", "-c", "1"]
    for bad, msg in ((["-n", "0", "x.py"], "at least 1"), (["--emulate", "two", "x.py"], "number of ranks"),
                     (["-n", "2"], "no program"), (["-n", "2", "--emulate", "4", "x.py"], "disagree")):
        with pytest.raises(launch.LaunchError, match=msg):
            launch.parse_args(bad)


def test_command_openmpi_root_and_oversubscribe():
    o = launch.parse_args(["--emulate", "4", "x.py", "a"])
    env = launch.emulation_env(4, "0", "/p", "/l")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert launch.emulation_env(3, "1", "/p", "/l")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    cmd, add = launch.build_command(o, nranks=4, extra_env=env, flavour="openmpi", is_root=True, cpus=64)
    assert cmd[1:3] == ["-np", "4"] and "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert add["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and "CUDA_MPS_PIPE_DIRECTORY" in cmd
    assert cmd[-2].endswith("x.py") and cmd[-1] == "a"
    o = launch.parse_args(["-n", "8", "x.py"])
    cmd, add = launch.build_command(o, nranks=8, extra_env={}, flavour="openmpi", is_root=False, cpus=64)
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd and not add


def test_emulate_starts_and_stops_mps(fakes):
    assert launch.main(["--emulate", "4", "x.py"]) == 0
    lines = fakes.read_text().splitlines()
    assert lines[0].startswith("start ") and "pct=25 cvd=0 emu=1" in lines[1] and lines[2].startswith("quit ")
    assert lines[3].startswith("exit ")  # the foreground daemon really ended before main() returned
    pipe = lines[0].split()[1]
    assert lines[2].split()[1] == pipe and not os.path.exists(pipe)  # same private daemon; folder removed


def test_emulate_falls_back_to_daemon_mode(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_NO_FOREGROUND", "1")
    assert launch.main(["--emulate", "2", "x.py"]) == 0
    lines = fakes.read_text().splitlines()
    assert lines[0].startswith("start-d ") and lines[-1].startswith("quit ")


def test_emulate_stops_mps_when_the_run_fails(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_RC", "3")
    assert launch.main(["--emulate", "2", "x.py"]) == 3
    assert fakes.read_text().splitlines()[-2].startswith("quit ")


def test_emulate_stops_mps_on_sigterm(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_KILL_PARENT", "1")
    assert launch.main(["--emulate", "2", "x.py"]) == 130
    assert [ln.split()[0] for ln in fakes.read_text().splitlines()[-2:]] == ["quit", "exit"]


def test_missing_mps_is_a_clear_error(fakes, monkeypatch, capsys):
    monkeypatch.setenv("RAWFLUX_MPS_CONTROL", "/nonexistent/nvidia-cuda-mps-control")
    assert launch.main(["--emulate", "2", "x.py"]) == 2
    assert "MPS control binary" in capsys.readouterr().err


def test_default_rank_count_is_the_gpu_count(fakes, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert launch.main(["--dry-run", "x.py"]) == 0
    assert "-np 3" in capsys.readouterr().out


def _group_gone(pgid):
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True


def test_hung_quit_still_stops_mps(fakes, monkeypatch):
    """'quit' hanging (seen after Ctrl-C with killed clients): the daemon's process group is
    terminated by its id after the quit timeout, and main() still returns."""
    monkeypatch.setattr(launch, "_MPS_QUIT_TIMEOUT_S", 1.0)
    monkeypatch.setenv("FAKE_QUIT_HANGS", "1")
    started = []
    real_popen = launch.subprocess.Popen

    def spy(*a, **kw):
        p = real_popen(*a, **kw)
        started.append(p)
        return p

    monkeypatch.setattr(launch.subprocess, "Popen", spy)
    t0 = time.monotonic()
    assert launch.main(["--emulate", "2", "x.py"]) == 0
    assert time.monotonic() - t0 < 30
    daemon = started[0]
    assert daemon.poll() is not None and _group_gone(daemon.pid)


def test_lingering_server_is_reaped(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_SERVER_LINGERS", "1")
    monkeypatch.setattr(launch, "_reap_group", lambda pgid, grace_s=0.5, _r=launch._reap_group: _r(pgid, grace_s))
    started = []
    real_popen = launch.subprocess.Popen

    def spy(*a, **kw):
        p = real_popen(*a, **kw)
        started.append(p)
        return p

    monkeypatch.setattr(launch.subprocess, "Popen", spy)
    assert launch.main(["--emulate", "2", "x.py"]) == 0
    time.sleep(0.2)
    assert _group_gone(started[0].pid)  # the ignoring-SIGTERM "server" got SIGKILL

import os, subprocess, sys, time, socket, tempfile, signal
from pathlib import Path
sys.path.insert(0, "/work/main/bench")
import startup as S
tmp = Path(tempfile.mkdtemp())
env, argv = S._setup(tmp)
env["PROF_OUT"] = "/tmp/prof/berthd.prof"
py = "/work/ci1/.venv/bin/python"
# warm bytecode
cpu = S._until(argv, env, lambda: S._health_up(Path(env["BERTH_SOCKET"])))
print("plain cpu", cpu)
cpu = S._until([py, "/tmp/prof/prof_run.py"] + argv[1:], env, lambda: S._health_up(Path(env["BERTH_SOCKET"])))
print("profiled cpu", cpu)

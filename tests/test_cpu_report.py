"""``-p tests.cpu_report`` counts a test's CPU, its reaped children's included, by file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_childs_cpu_is_counted_for_its_tests_file(tmp_path):
    (tmp_path / "test_burns.py").write_text(
        "import subprocess, sys\n"
        "def test_a_child_burns_half_a_second():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\n"
        "t = time.process_time()\\nwhile time.process_time() - t < 0.5: pass'], check=True)\n"
        "def test_idle():\n"
        "    pass\n")
    report = tmp_path / "cpu.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BERTH_CPU_REPORT": str(report)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_report",
                        "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    section = r.stdout.split("CPU by test file")[1].splitlines()
    burns = next(line for line in section if line.endswith("test_burns.py"))
    cpu, tests = float(burns.split()[0]), int(burns.split()[1])
    assert cpu >= 0.5 and tests == 2, section
    assert len(report.read_text().splitlines()) == 2

"""``berth size`` (issue 37 "No way to find a size"): the memory to declare for a GGUF at a
context, with its parts and formulas; a running engine's measured peak and a suggested size;
``berth status`` flagging a declared size far from the peak."""

from __future__ import annotations

import subprocess

import gguf
import numpy as np
import pytest

from tests.berthd import BERTH, GiB, berth_run, wait_for


def _size(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "size", *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.real
def test_tiny_gguf_at_2048_is_at_least_the_file_with_its_parts(real_tools):
    path = real_tools.models / "tiny-a.gguf"
    r = _size(str(path), "--ctx", "2048")
    assert r.returncode == 0, r.stderr
    for part in ("weights", "KV cache", "compute buffers", "CUDA context", "total", "declare:"):
        assert part in r.stdout, r.stdout
    total = int(r.stdout.split("total")[1].split("(")[1].split(" bytes")[0])
    assert total >= path.stat().st_size
    # The KV line shows its formula with the file's figures (2 layers, 4 kv heads of 16).
    assert "2 layers × 2048 tokens" in r.stdout and "(16 + 16)" in r.stdout, r.stdout


def _write(path, *, layers=4, embd=256, heads=8, kv_heads=2, vocab=1000) -> int:
    """A llama GGUF of random f32 tensors (as ../shared/tools/README.md says the tiny ones were
    written); returns its tensors' bytes."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(embd * 2)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_vocab_size(vocab)
    n = 0
    for name, shape in [("token_embd.weight", (vocab, embd))] + [
            (f"blk.{i}.attn_q.weight", (embd, embd)) for i in range(layers)]:
        t = np.zeros(shape, dtype=np.float32)
        n += t.nbytes
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


def test_the_kv_cache_follows_the_formula_and_the_slots(tmp_path):
    from berth.size import estimate
    path = tmp_path / "m.gguf"
    tensors = _write(path)
    one = estimate(str(path), 1024, cuda_context_bytes=0)
    parts = {p.name: p.bytes for p in one.parts}
    assert parts["weights"] == tensors
    # 2 caches × 4 layers × 1024 tokens × 2 kv heads × 32 dims (256 / 8 heads) × 2 B.
    assert parts["KV cache"] == 2 * 4 * 1024 * 2 * 32 * 2
    four = {p.name: p.bytes for p in estimate(str(path), 1024, slots=4, cuda_context_bytes=0,
                                              cache_type="q8_0").parts}
    assert four["KV cache"] == 2 * 4 * 4096 * 2 * 32 * 34 // 32
    assert estimate(str(path), 5000).notes    # past the training context: said


def test_bad_input_is_named_not_a_traceback(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    r = _size(str(tmp_path / "x.gguf"), "--ctx", "512")
    assert r.returncode == 2 and "not a GGUF file" in r.stderr and "Traceback" not in r.stderr
    r = _size(str(tmp_path / "x.gguf"))
    assert r.returncode == 2 and "--ctx" in r.stderr
    r = _size(str(tmp_path / "x.gguf"), "--ctx", "0")
    assert r.returncode == 2 and "--ctx" in r.stderr and "Traceback" not in r.stderr


def test_a_running_engine_has_a_peak_a_suggestion_and_a_flag(berthd, runs):
    d = berthd()
    runs.append(berth_run(d, "llm", "--size", "6GiB", weights="1GiB"))

    def peak():
        # All of its memory: the 256 MiB context and the 1 GiB of weights. A peak of 1 GiB
        # could be a read taken mid-load, which grew before `berth size` read it (a flake).
        le = d.lease_of("llm")
        return le and le["ready"] and (le["shares"][0].get("peak_bytes") or 0) >= GiB + (256 << 20)
    wait_for(peak, 60, "llm serving with a measured peak of its 1.25 GiB")
    top = d.lease_of("llm")["shares"][0]["peak_bytes"]
    assert top < 2 * GiB
    r = _size("llm", env=d.env)
    assert r.returncode == 0, r.stderr
    assert "declared 6.0GiB" in r.stdout and "measured peak" in r.stdout
    want = -(-int(top * 1.1) // (256 << 20)) * 256    # 10% above, whole 256 MiB steps
    assert f"suggested: --size {want}MiB" in r.stdout, r.stdout
    status = subprocess.run([BERTH, "status"], capture_output=True, text=True, env=d.env,
                            timeout=60)
    assert "llm" in status.stdout and "under half its declared size" in status.stdout, \
        status.stdout
    r = _size("nobody", env=d.env)
    assert r.returncode == 1 and "no lease or engine 'nobody'" in r.stderr


def test_a_ceiling_is_not_flagged_for_a_peak_under_it():
    """A growth bound's size is a ceiling (ComfyUI's 20 GiB): a peak far under it is what the
    bound is for; a peak above it is still said."""
    from berth.size import far_from_peak
    assert far_from_peak(20 * GiB, 1 * GiB, ceiling=True) is None
    assert "under half" in far_from_peak(20 * GiB, 1 * GiB)
    assert "above its declared size" in far_from_peak(2 * GiB, 3 * GiB, ceiling=True)


def test_a_missing_or_unreadable_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "gone.gguf"
    r = _size(str(missing), "--ctx", "512")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == f"berth size: {missing}: no such file\n"
    (tmp_path / "dir.gguf").mkdir()
    r = _size(str(tmp_path / "dir.gguf"), "--ctx", "512")
    assert r.returncode == 2 and "Errno" not in r.stderr
    assert r.stderr.startswith(f"berth size: {tmp_path / 'dir.gguf'}: ")


def test_a_bad_cuda_context_names_the_field_once():
    r = _size("model.gguf", "--ctx", "512", "--cuda-context", "abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.count("--cuda-context") == 1 and "got 'abc'" in last, last


def test_a_file_of_another_format_says_so_not_the_readers_internals(tmp_path):
    """A safetensors or text file given as the model (a new user's find) was refused with
    the GGUF reader's own words: "When changing to a larger dtype, its size must be a divisor
    of the total size in bytes of the last axis of the array". The line names the file and
    what its first bytes are not, and the format `berth size` reads."""
    st = tmp_path / "model.safetensors"
    st.write_bytes((16).to_bytes(8, "little") + b'{"__metadata__":{}}' + bytes(64))
    text = tmp_path / "notes.gguf"
    text.write_text("hi\n")
    for path in (st, text):
        r = _size(str(path), "--ctx", "512")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"berth size: {path}: not a GGUF file"), r.stderr
        assert "does not start with 'GGUF'" in r.stderr, r.stderr
        assert "dtype" not in r.stderr and "Sorry" not in r.stderr, r.stderr

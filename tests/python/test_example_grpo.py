"""examples/grpo_hf.py (GRPO on a HF Qwen3 with lockstep's rollout engine) run as a subprocess in a
short mode: exit 0, 0 log-prob mismatches on every step's JSON line, PPO ratios exactly 1.0 on
each step's first mini-batch, --plot writes a PNG, --out saves a model that loads back; bad flags
exit 2 with a message naming the flag."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "grpo_hf.py"
SHORT = ["--steps", "2", "--group-size", "2", "--prompts", "4", "--warmup-steps", "2",
         "--warmup-batch", "8"]


def run(*args, timeout=300):
    # Run from the test's directory: `import lockstep` is the installed package (as the suite).
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.dirname(__file__),
    )


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo_hf")
    plot, out = tmp / "run.png", tmp / "ckpt"
    proc = run(*SHORT, "--json", "--plot", str(plot), "--out", str(out))
    return proc, plot, out


def test_short_run_has_no_mismatches(short_run):
    proc, _, _ = short_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["step"] for r in lines] == [0, 1]
    for r in lines:
        assert r["mismatches"] == 0, r
        assert r["compared"] > 0, r
        # exp(logp - old) is exactly 1.0 only when the two log-probs are the same float
        assert r["ratio_min"] == 1.0 and r["ratio_max"] == 1.0, r
        assert 0.0 <= r["reward_mean"] <= 1.0, r
        assert r["weight_version"] == r["step"] + 1, r
    assert "PASS: 0 log-prob mismatches" in proc.stderr


def test_plot_is_a_png(short_run):
    proc, plot, _ = short_run
    assert proc.returncode == 0, proc.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoint_loads_back(short_run):
    proc, _, out = short_run
    assert proc.returncode == 0, proc.stderr
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen3ForCausalLM.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)
    ids = tok.encode("abcd=", add_special_tokens=False)  # the default task: reverse a word
    assert len(ids) == 5 and tok.decode(ids) == "abcd="


def test_add_task_has_no_mismatches():
    proc = run(*SHORT, "--task", "add", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in map(json.loads, proc.stdout.splitlines()):
        assert r["mismatches"] == 0 and r["compared"] > 0, r
        assert r["ratio_min"] == 1.0 and r["ratio_max"] == 1.0, r


def load_example():
    spec = importlib.util.spec_from_file_location("grpo_hf", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["--group-size", "1"], "--group-size: must be >= 2"),
        (["--steps", "0"], "--steps: must be >= 1"),
        (["--steps", "two"], "--steps: expected an integer"),
        (["--prompts", "2", "--mini-batches", "3"], "--mini-batches 3 exceeds --prompts 2"),
        (["--plot", "run.svg"], "expected a .png"),
        (["--rollout-tp", "3"], "--rollout-tp: invalid choice"),
        (["--task", "sort"], "--task: invalid choice"),
        (["--task", "reverse", "--size", "2"], "--size: must be >= 3"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_flags_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        load_example().parse_args(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_flag_exits_2_from_the_command_line():
    proc = run("--group-size", "1", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "argument --group-size: must be >= 2, got 1" in proc.stderr

"""molora.demo: the end-to-end decode layer passes its check (CPU path in-process, small sizes;
the GPU path under the `gpu` marker), a deliberately wrong molora result is caught, and the
`molora demo` CLI passes its arguments through (when the CLI is built)."""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from molora import demo

SMALL = ["--device", "cpu", "-T", "12", "--slots", "3", "--rank", "16", "--reps", "1"]


def test_cpu_step_passes_check():
    res = demo.run(SMALL)
    assert res["ok"], res["max_err"]
    assert res["device"] == "cpu"
    assert res["no_adapter_tokens"] == 3  # 25% of 12
    parts = [r["part"] for r in res["rows"]]
    for p in ("align (molora, V=S*E)", "lora delta gate", "lora delta up", "lora delta down",
              "all-reduce (world 1: pass-through)"):
        assert p in parts
    lora = [r for r in res["rows"] if r["part"].startswith("lora")]
    assert len(lora) == 3 and all(r["floor_us"] > 0 and r["bytes"] > 0 for r in lora)
    table = demo.format_table(res)
    assert "PASS" in table and "LoRA as lora_moe_delta" in table
    # a delta row's bytes and floor are its shrink's and expand's together
    for proj in ("gate", "up", "down"):
        pl = res["plans"]
        d, sh, ex = pl[f"lora delta {proj}"], pl[f"lora shrink {proj}"], pl[f"lora expand {proj}"]
        assert d["bytes"] == sh["bytes"] + ex["bytes"] > 0
        assert d["floor_us"] == pytest.approx(sh["floor_us"] + ex["floor_us"])


@pytest.mark.parametrize("routing", ["aligned", "plain"])
def test_cpu_pair_calls_give_the_deltas_bits(routing):
    """--lora-call pair (shrink then expand, six rows) and the default delta (three rows) give
    the same output bits: lora_moe_delta is the pair in one call."""
    extra = ["--routing", routing]
    res_d = demo.run(SMALL + extra)
    res_p = demo.run(SMALL + extra + ["--lora-call", "pair"])
    assert res_d["ok"] and res_p["ok"], (res_d["max_err"], res_p["max_err"])
    lora_p = [r["part"] for r in res_p["rows"] if r["part"].startswith("lora")]
    assert lora_p == [f"lora {op} {proj}" for proj in ("gate", "up", "down")
                      for op in ("shrink", "expand")]
    assert "LoRA as shrink + expand" in demo.format_table(res_p)
    assert np.array_equal(res_d["y"], res_p["y"])
    assert np.abs(res_d["y"]).max() > 0


@pytest.mark.parametrize("extra", [["--routing", "plain"], ["--no-adapter", "0"],
                                   ["--no-adapter", "1"], ["--block-size", "32", "--rank", "32"]])
def test_cpu_variants_pass(extra):
    res = demo.run(SMALL + extra)
    assert res["ok"], (extra, res["max_err"])


@pytest.mark.parametrize("call", ["delta", "pair"])
@pytest.mark.parametrize("how", ["skip-down-lora", "output"])
def test_wrong_result_is_caught(how, call, capsys):
    res = demo.run(SMALL + ["--perturb", how, "--lora-call", call])
    assert not res["ok"] and res["max_err"] > res["tol"]
    assert demo.main(SMALL + ["--perturb", how, "--lora-call", call]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_main_exit_code_and_profile_on_cpu(tmp_path, capsys):
    assert demo.main(SMALL + ["--profile", str(tmp_path / "t.json.gz"),
                              "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "--profile needs a GPU" in out and "PASS" in out
    assert not (tmp_path / "t.json.gz").exists()
    assert (tmp_path / "r.json").exists()


def test_world_other_than_one_is_refused():
    with pytest.raises(SystemExit, match="world"):
        demo.run(SMALL + ["--world", "2"])


def test_package_imports_without_torch():
    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.modules['torch'] = None; import molora, molora.demo, "
                        "molora.torch_ops; print('ok')"],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


@pytest.mark.gpu
def test_gpu_step_graph_replay_passes_check(tmp_path):
    res = demo.run(["-T", "64", "--reps", "20", "--profile", str(tmp_path / "t.json.gz")])
    print(demo.format_table(res))
    assert res["device"] != "cpu"
    assert res["ok"], res["max_err"]
    assert res["total_us"] > 0
    assert (tmp_path / "t.json.gz").exists()
    base = res.get("baseline")
    assert base is not None and base.get("align (molora, V=S*E)", 0) > 0, base
    assert not any("failed" in n for n in base["note"]), base["note"]
    if "max_err" in base:
        assert base["max_err"] <= res["tol"]


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [["--routing", "plain"], ["-T", "1"], ["--rank", "8"],
                                   ["--lora-call", "pair"],
                                   ["--lora-call", "pair", "--routing", "plain"]])
def test_gpu_variants_pass(extra):
    res = demo.run(["-T", "16", "--reps", "5"] + extra)
    print(demo.format_table(res))
    assert res["ok"], (extra, res["max_err"])


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["delta", "pair"])
def test_gpu_wrong_result_is_caught(call):
    res = demo.run(["-T", "16", "--reps", "2", "--no-baseline", "--perturb", "skip-down-lora",
                    "--lora-call", call])
    assert not res["ok"]


# ---- the CLI ---------------------------------------------------------------------------------

def _cli():
    env = os.environ.get("MOLORA_CLI")
    if env and os.access(env, os.X_OK):
        return env
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pkg_side = demo.find_cli()
    cands = ([pkg_side] if pkg_side else []) + [os.path.join(root, "build", "src", "cli", "molora")]
    cands += sorted(glob.glob(os.path.join(root, "build*", "src", "cli", "molora")))
    for c in cands:
        if c and os.access(c, os.X_OK):
            r = subprocess.run([c, "--help"], capture_output=True, text=True)
            if " demo" in r.stdout:
                return c
    pytest.skip("no molora CLI with the demo command built (build/src/cli/molora)")


def test_cli_demo_help():
    r = subprocess.run([_cli(), "demo", "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--shape" in r.stdout and "--profile" in r.stdout


def test_cli_demo_tiny_run_and_exit_code():
    cli = _cli()
    r = subprocess.run([cli, "demo"] + SMALL, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout
    r = subprocess.run([cli, "demo"] + SMALL + ["--perturb", "output"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "FAIL" in r.stdout
    r = subprocess.run([cli, "demo", "--shape", "nope"], capture_output=True, text=True)
    assert r.returncode == 2

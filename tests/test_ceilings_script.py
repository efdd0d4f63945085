"""scripts/ceilings.py end to end, on run folders written the way the trainer writes them: its paired
differences against a computation by hand, its dynamics table against the metrics it reads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FINAL = {"grpo": [0.41, 0.40, 0.43], "grpo_oracle": [0.42, 0.42, 0.44]}


def write_run(folder: Path, method: str, seed: int, final: float) -> None:
    run = folder / "runs" / f"{method}-seed{seed}"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"estimator": method}, "train": {"seed": seed}}))
    steps = [{"step": s, "rollout/tokens_generated": 100.0, "response_length/mean": 60.0 + s + seed,
              "entropy/mean": 0.5 - 0.01 * s, "groups/zero_var_frac": 0.2 + 0.02 * s,
              "credit/free_share": 0.0 if method == "grpo_oracle" else 0.5} for s in range(1, 11)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    for step, accuracy in ((0, 0.28), (5, final - 0.05), (10, final)):
        (run / "eval" / f"step-{step:06d}.json").write_text(json.dumps({"accuracy": accuracy}))
    (run / "summary.json").write_text(json.dumps({"heldout_accuracy_before": 0.28, "heldout_accuracy_after": final,
                                                  "mean_length_after": 66.0}))


@pytest.mark.filterwarnings("ignore")
def test_ceilings_table_and_dynamics(tmp_path: Path) -> None:
    folder = tmp_path / "compare"
    for method, finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(folder, method, seed, final)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(folder), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    rows = json.loads((out / "summary.json").read_text())

    diffs = [m - g for m, g in zip(FINAL["grpo_oracle"], FINAL["grpo"], strict=True)]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    t_975_df2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)
    oracle = rows["grpo_oracle"]
    assert oracle["diff"] == pytest.approx(mean)
    assert oracle["diff_low"] == pytest.approx(mean - t_975_df2 * sd / math.sqrt(3))
    assert oracle["free_share"] == 0 and rows["grpo"]["free_share"] == pytest.approx(0.5)
    assert oracle["tokens"] == pytest.approx(1000.0)

    # first five steps 1..5 and last five 6..10; lengths 60 + step + seed, averaged over seeds 0..2
    length_first, length_last = rows["grpo"]["dynamics"]["response_length/mean"]
    assert length_first == pytest.approx(60 + 3 + 1) and length_last == pytest.approx(60 + 8 + 1)
    entropy_first, entropy_last = rows["grpo"]["dynamics"]["entropy/mean"]
    assert entropy_first == pytest.approx(0.47) and entropy_last == pytest.approx(0.42)
    agree_first, agree_last = rows["grpo"]["dynamics"]["rollout/agreeing_frac"]  # groups/zero_var_frac, 0.2 + 0.02 step
    assert agree_first == pytest.approx(0.26) and agree_last == pytest.approx(0.36)
    assert "64.0 -> 69.0" in (out / "dynamics.md").read_text()
    assert (out / "table.md").is_file() and (out / "accuracy.png").is_file()


def test_ceilings_counts_the_groups_dynamic_sampling_dropped(tmp_path: Path) -> None:
    """Steps logged before `rollout/agreeing_frac` (here steps 1-5): under dynamic sampling the batch holds no
    agreeing group, so the share comes from the groups sampled and kept; 16 sampled, 4 of 8 responses each kept,
    3/4 agreed. Steps 6-10 log the share, 0.5."""
    folder = tmp_path / "compare"
    for seed in range(2):
        write_run(folder, "grpo", seed, 0.4)
        run = folder / "runs" / f"grpo-seed{seed}"
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["rollout"] = {"dynamic_sampling": True, "group_size": 8}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for m in steps:
            m.update({"groups/zero_var_frac": 0.0, "rollout/sampled_groups": 16.0, "rollout/rows": 32.0})
            if m["step"] > 5:
                m["rollout/agreeing_frac"] = 0.5
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(folder), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    rows = json.loads((out / "summary.json").read_text())
    assert rows["grpo"]["dynamics"]["rollout/agreeing_frac"] == [pytest.approx(0.75), pytest.approx(0.5)]


@pytest.mark.filterwarnings("ignore")
def test_ceilings_pooled_takes_the_spread_of_every_arm(tmp_path: Path) -> None:
    """--pooled: a two-seed arm against a three-seed baseline, the sd pooled over the three arms (scipy's
    one-way ANOVA gives the within-arm mean square)."""
    from scipy import stats

    finals = {**FINAL, "mpo": [0.45, 0.41]}
    folder = tmp_path / "compare"
    for method, values in finals.items():
        for seed, final in enumerate(values):
            write_run(folder, method, seed, final)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(folder), "-o", str(out), "--pooled",
                    "--holm", "mpo,grpo_oracle"], check=True, capture_output=True, text=True)
    mpo = json.loads((out / "summary.json").read_text())["mpo"]
    groups = list(finals.values())
    f = stats.f_oneway(*groups)
    grand = sum(map(sum, groups)) / sum(map(len, groups))
    between = sum(len(g) * (sum(g) / len(g) - grand) ** 2 for g in groups) / (len(groups) - 1)
    within = between / f.statistic  # F = between-arm mean square / within-arm mean square
    se = math.sqrt(within * (1 / 2 + 1 / 3))
    mean = sum(finals["mpo"]) / 2 - sum(finals["grpo"]) / 3
    assert mpo["diff"] == pytest.approx(mean) and mpo["sd_diff"] == pytest.approx(math.sqrt(within))
    assert mpo["p"] == pytest.approx(2 * stats.t.sf(abs(mean) / se, 8 - 3))
    assert mpo["p_adjusted"] >= mpo["p"] and "pooled" in (out / "table.md").read_text()


@pytest.mark.filterwarnings("ignore")
def test_ceilings_pooled_gives_a_one_seed_arm_a_difference_but_no_interval_of_its_own(tmp_path: Path) -> None:
    """A method with one finished seed so far: its difference from the baseline takes the sd pooled over the
    other arms, while its own final accuracy has no spread to show."""
    folder = tmp_path / "compare"
    for method, values in {**FINAL, "erpo": [0.39]}.items():
        for seed, final in enumerate(values):
            write_run(folder, method, seed, final)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(folder), "-o", str(out), "--pooled"],
                   check=True, capture_output=True, text=True)
    erpo = json.loads((out / "summary.json").read_text())["erpo"]
    assert erpo["seeds"] == 1 and erpo["diff"] == pytest.approx(0.39 - sum(FINAL["grpo"]) / 3)
    assert math.isfinite(erpo["diff_low"]) and erpo["diff_low"] < erpo["diff"] < erpo["diff_high"]
    row = next(line for line in (out / "table.md").read_text().splitlines() if line.startswith("| erpo |"))
    assert "0.390 (one seed)" in row and "±" not in row


@pytest.mark.filterwarnings("ignore")
def test_ceilings_compares_a_tagged_folders_methods_with_its_own_baseline(tmp_path: Path) -> None:
    """A folder given as PATH@two: its runs were made under other settings, so tepo@two is compared with
    grpo@two (the same folder's GRPO), with the sd still pooled over every arm of both folders."""
    from scipy import stats

    one, two = tmp_path / "one_update", tmp_path / "two_updates"
    arms = {"grpo": (one, [0.41, 0.40, 0.43]), "mpo": (one, [0.45, 0.41]),
            "grpo@two": (two, [0.30, 0.33]), "tepo@two": (two, [0.36, 0.35])}
    for label, (folder, values) in arms.items():
        for seed, final in enumerate(values):
            write_run(folder, label.split("@")[0], seed, final)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(one), f"{two}@two", "-o", str(out),
                    "--pooled", "--holm", "mpo,tepo@two"], check=True, capture_output=True, text=True)
    rows = json.loads((out / "summary.json").read_text())
    assert set(rows) == set(arms)
    within = sum(sum((v - sum(vs) / len(vs)) ** 2 for v in vs) for _, vs in arms.values()) / (9 - 4)
    mean = (0.36 + 0.35) / 2 - (0.30 + 0.33) / 2
    se = math.sqrt(within * (1 / 2 + 1 / 2))
    assert rows["tepo@two"]["diff"] == pytest.approx(mean)
    assert rows["tepo@two"]["p"] == pytest.approx(2 * stats.t.sf(abs(mean) / se, 9 - 4))
    assert rows["mpo"]["diff"] == pytest.approx(0.43 - sum(arms["grpo"][1]) / 3)
    assert "diff" not in rows["grpo@two"] and "compared with grpo@TAG" in (out / "table.md").read_text()

    missing = tmp_path / "no_baseline"
    write_run(missing, "tepo", 0, 0.3)
    refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(one), f"{missing}@two",
                              "-o", str(tmp_path / "y")], capture_output=True, text=True)
    assert refused.returncode != 0 and "no finished grpo@two runs" in refused.stderr


@pytest.mark.filterwarnings("ignore")
def test_runs_known_only_by_their_figures_count_as_their_folders_would(tmp_path: Path) -> None:
    """--figures: GRPO's runs given by their figures alone (before, after, tokens) give the oracle the same
    difference, interval, p and MDE as GRPO's run folders do; their dynamics are left blank, not zero, and
    first evaluations at different steps are not compared."""
    for method, finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(tmp_path / "all", method, seed, final)
            if method != "grpo":
                write_run(tmp_path / "oracle_only", method, seed, final)
    figures = tmp_path / "grpo_figures.json"
    figures.write_text(json.dumps({"step": 10, "source": "this test", "runs": [
        {"label": "grpo", "seed": seed, "before": 0.28, "after": final, "tokens": 1000}
        for seed, final in enumerate(FINAL["grpo"])]}))
    rows = {}
    for name, args in (("folders", [tmp_path / "all"]), ("figures", [tmp_path / "oracle_only", "--figures", figures])):
        for pooled in ([], ["--pooled"]):
            out = tmp_path / f"{name}{''.join(pooled)}"
            subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), *map(str, args), "-o", str(out),
                            *pooled], check=True, capture_output=True, text=True)
            rows[name + "".join(pooled)] = json.loads((out / "summary.json").read_text())
    for pooled in ("", "--pooled"):
        by_folder, by_figure = rows["folders" + pooled], rows["figures" + pooled]
        for key in ("diff", "diff_low", "diff_high", "p", "sd_diff", "mde"):
            assert by_figure["grpo_oracle"][key] == pytest.approx(by_folder["grpo_oracle"][key]), key
        # the folders' first evaluation after step 0 is step 5, the figures' step 10: not compared
        assert by_folder["grpo_oracle"]["early_step"] == 5 and by_figure["grpo_oracle"]["early_step"] is None
        assert by_figure["grpo"]["tokens"] == by_folder["grpo"]["tokens"] == pytest.approx(1000.0)
    assert all(math.isnan(v) for v in rows["figures"]["grpo"]["dynamics"]["entropy/mean"])
    grpo_row = next(line for line in (tmp_path / "figures" / "table.md").read_text().splitlines()
                    if line.startswith("| grpo |"))
    assert grpo_row.rstrip(" |").endswith("–")  # no mean length: the figures do not give it

    twice = subprocess.run([sys.executable, str(ROOT / "scripts" / "ceilings.py"), str(tmp_path / "all"), "--figures",
                            str(figures), "-o", str(tmp_path / "twice")], capture_output=True, text=True)
    assert twice.returncode == 2 and "a seed given twice" in twice.stderr
    assert not (tmp_path / "twice").exists()  # refused before anything is written

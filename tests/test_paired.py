"""Paired comparisons by seed, Holm's correction and the detectable difference, against independent computations."""

from __future__ import annotations

import math

import pytest

from pivotrl.analysis.paired import (
    detectable_difference,
    holm,
    paired_difference,
    pooled_detectable_difference,
    pooled_difference,
)


def test_paired_difference_by_hand() -> None:
    method = {0: 0.50, 1: 0.44, 2: 0.47, 3: 0.52}
    baseline = {0: 0.45, 1: 0.43, 2: 0.44, 3: 0.47, 9: 0.99}  # seed 9 has no partner: left out
    got = paired_difference(method, baseline)
    diffs = [0.05, 0.01, 0.03, 0.05]
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    t_975_df3 = 3.182446305284263  # Student's t, 97.5th percentile, 3 degrees of freedom (tables)
    assert got.seeds == 4 and got.mean == pytest.approx(mean)
    assert got.low == pytest.approx(mean - t_975_df3 * sd / 2) and got.high == pytest.approx(mean + t_975_df3 * sd / 2)
    # t = 3.674 on 3 df: two-sided p = 0.0349 (tables)
    assert got.p_value == pytest.approx(0.0349, abs=5e-4)


def test_pooled_difference_is_the_linear_models_contrast() -> None:
    """Against an ordinary least-squares fit with one mean per arm (numpy), and, for two arms alone,
    scipy's equal-variance two-sample t-test."""
    import numpy as np
    from scipy import stats

    arms = {"grpo": [0.38, 0.382, 0.371, 0.39], "erpo": [0.36, 0.375, 0.352, 0.37], "mpo": [0.40, 0.37],
            "tepo": [0.35, 0.38]}
    got = pooled_difference(arms["mpo"], arms["grpo"], list(arms.values()))
    names = list(arms)
    y = np.array([x for a in names for x in arms[a]])
    design = np.array([[float(a == b) for b in names] for a in names for _ in arms[a]])
    beta, residuals, *_ = np.linalg.lstsq(design, y, rcond=None)
    df = len(y) - len(names)
    variance = residuals[0] / df
    contrast = np.array([float(b == "mpo") - float(b == "grpo") for b in names])
    se = math.sqrt(variance * contrast @ np.linalg.inv(design.T @ design) @ contrast)
    t = contrast @ beta / se
    assert got.df == df == 8 and got.sd == pytest.approx(math.sqrt(variance))
    assert got.mean == pytest.approx(contrast @ beta)
    assert got.p_value == pytest.approx(2 * stats.t.sf(abs(t), df))
    half = stats.t.ppf(0.975, df) * se
    assert (got.low, got.high) == pytest.approx((contrast @ beta - half, contrast @ beta + half))
    two = pooled_difference(arms["erpo"], arms["grpo"], [arms["erpo"], arms["grpo"]])
    assert two.p_value == pytest.approx(stats.ttest_ind(arms["erpo"], arms["grpo"], equal_var=True).pvalue)


def test_pooled_detectable_difference_by_hand() -> None:
    # (t_{0.975, 15} + t_{0.8, 15}) sd sqrt(1/2 + 1/4) = (2.1314 + 0.8662) * 0.01 * 0.8660 = 0.02596
    assert pooled_detectable_difference(0.01, 2, 4, 15) == pytest.approx(0.02596, abs=1e-4)
    assert pooled_detectable_difference(0.01, 4, 4, 15) < pooled_detectable_difference(0.01, 2, 4, 15)
    assert pooled_detectable_difference(0.01, 2, 4, 15, tests=7) > pooled_detectable_difference(0.01, 2, 4, 15)


def test_holm_by_hand() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> made non-decreasing: 0.03, 0.06, 0.06
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})


def test_detectable_difference_shrinks_with_seeds_and_grows_with_tests() -> None:
    # (t_{0.975, 7} + t_{0.8, 7}) sd / sqrt(8) = (2.3646 + 0.8960) * 0.02 / 2.8284 = 0.02306
    assert detectable_difference(0.02, 8) == pytest.approx(0.02306, abs=1e-4)
    assert detectable_difference(0.02, 12) < detectable_difference(0.02, 8) < detectable_difference(0.02, 8, tests=3)


def test_heldout_paired_script_pairs_sample_files_by_problem(tmp_path) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    from scipy import stats

    before = [1, 0, 0, 1, 0, 1, 0, 0]
    after = [[1, 1], [1, 0], [0, 0], [1, 1], [1, 1], [1, 0], [0, 1], [0, 0]]  # two samples each
    files = [tmp_path / "before.jsonl", tmp_path / "after.jsonl"]
    files[0].write_text("".join(json.dumps({"problem": i, "sample": 0, "reward": r}) + "\n" for i, r in enumerate(before)))
    files[1].write_text("".join(json.dumps({"problem": i, "sample": s, "reward": r}) + "\n"
                                for i, rs in enumerate(after) for s, r in enumerate(rs)))
    script = Path(__file__).parents[1] / "scripts" / "heldout_paired.py"
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(script), "--samples", *map(str, files), "--json", str(out)], check=True,
                   capture_output=True)
    (got,) = json.loads(out.read_text())
    means = [sum(rs) / len(rs) for rs in after]
    expected = stats.ttest_rel(means, before)
    interval = expected.confidence_interval(0.95)
    assert got["problems"] == 8
    assert got["mean"] == pytest.approx(sum(means) / 8 - sum(before) / 8)
    assert (got["low"], got["high"]) == pytest.approx((interval.low, interval.high))
    assert got["p"] == pytest.approx(expected.pvalue)

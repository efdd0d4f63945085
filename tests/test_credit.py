"""`pivotrl credit`: Monte-Carlo ground truth A* and the estimators' scores against it."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from pivotrl.analysis.credit import run_credit
from pivotrl.analysis.credit_stats import (
    METRICS,
    bootstrap_ci,
    centre_per_response,
    entropy_deciles,
    estimator_metrics,
    select_positions,
    sign_agreement,
    spearman,
    top_mass_share,
    top_weights,
)
from pivotrl.cli import app
from pivotrl.modeling.policy import load_policy
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout import make_engine
from pivotrl.tasks import Problem, ProblemList, Task, get_task

DECISIVE = 3  # the position whose token decides the reward


def fixed_policy(tokenizer: Any, probs: dict[str, float]) -> LlamaForCausalLM:
    """A real LlamaForCausalLM whose next-token distribution is `probs` after every context.

    Every token embeds to the same vector of ones and every layer's output projections are
    zero, so the last hidden state is the same for every context; the LM head then turns it
    into log(probs) (tokens not named get a logit of -30).
    """
    hidden = 8
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = LlamaForCausalLM(config)
    logits = torch.full((len(tokenizer),), -30.0)
    for token, p in probs.items():
        logits[tokenizer.convert_tokens_to_ids(token)] = math.log(p)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        # the final hidden state is ones / sqrt(1 + eps): each logit is (row · ones) / sqrt(1 + eps)
        scale = math.sqrt(1 + config.rms_norm_eps)
        model.lm_head.weight.copy_((logits * scale / hidden).unsqueeze(1).expand(-1, hidden))
    return model.eval()


class DecisiveTask(Task):
    """The reward is 1 when the response's character at `answer` is 'a' (and the response reaches it)."""

    name = "decisive"

    def __init__(self, num_problems: int) -> None:
        super().__init__()
        self.num_problems = num_problems

    def _load(self, split: str) -> ProblemList:
        return ProblemList([Problem(f"q{i}", DECISIVE) for i in range(self.num_problems)], source="test")

    def verifier(self, completion: str, answer: Any) -> float:
        return float(len(completion) > answer and completion[answer] == "a")


def run_decisive(out: Path, probs: dict[str, float], *, k: int, group_size: int = 8, problems: int = 2,
                 max_new_tokens: int = 6, **options: Any) -> dict[str, Any]:
    tokenizer = build_char_tokenizer()
    model = fixed_policy(tokenizer, probs)
    task = DecisiveTask(problems)
    items = task.problems("test")
    return run_credit(model, tokenizer, make_engine("hf", model, tokenizer), task, items,
                      [task.format_prompt(p) for p in items], out, model_name="fixed", task_name="decisive",
                      group_size=group_size, k=k, max_new_tokens=max_new_tokens, bootstrap=200, **options)


@pytest.fixture(scope="module")
def decisive_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decisive")


@pytest.fixture(scope="module")
def decisive(decisive_dir: Path) -> dict[str, Any]:
    """'a' or 'b' with probability 1/2 each at every position, never EOS: only position 3 matters."""
    return run_decisive(decisive_dir, {"a": 0.5, "b": 0.5}, k=64)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The shipped policy on countdown, small: 2 prompts x 4 responses, K = 2."""
    out = tmp_path_factory.mktemp("shipped")
    model, tokenizer = load_policy("tiny")
    task = get_task("countdown", train_size=10, test_size=16)
    items = task.problems("test")[:2]
    result = run_credit(model, tokenizer, make_engine("hf", model, tokenizer), task, items,
                        [task.format_prompt(p) for p in items], out, model_name="tiny", task_name="countdown",
                        group_size=4, k=2, bootstrap=100, ablations=True, html_estimators=("grpo", "erpo", "gtpo"))
    return result, out


def test_a_star_is_large_at_the_deciding_token_and_zero_elsewhere(decisive: dict[str, Any]) -> None:
    positions = decisive["positions"]
    assert len(positions) == 2 * 8 * 6  # every position of every (never-ending) response
    for pos in positions:  # the model is what the test built: a fair coin between 'a' and 'b'
        assert pos["logprob"] == pytest.approx(math.log(0.5), abs=1e-4)
        assert pos["entropy"] == pytest.approx(math.log(2), abs=1e-4)
    for pos in positions:
        reward = decisive["responses"][pos["response"]]["reward"]
        if pos["t"] == DECISIVE:
            # the token decides: A* = R - 1/2 in truth
            assert abs(pos["advantage_true"]) > 0.3
            assert abs(pos["advantage_true"] - (reward - 0.5)) <= 4 * pos["se"]
            assert pos["v_after"] == reward and pos["se_after"] == 0.0
        elif pos["t"] > DECISIVE:
            assert pos["advantage_true"] == 0.0 and pos["se"] == 0.0  # decided already: every continuation agrees
        else:
            assert pos["se"] > 0.05 and abs(pos["advantage_true"]) <= 4 * pos["se"]
    summary = decisive["summary"]
    # one V per distinct prefix: the prompt's value is shared by its group, and so are equal early prefixes
    assert summary["prefixes"] < sum(1 for p in positions if p["t"] <= DECISIVE)
    assert summary["continuations"] == summary["prefixes"] * 64


def test_the_same_prefix_gets_one_estimate(decisive: dict[str, Any]) -> None:
    seen: dict[tuple, tuple[float, float]] = {}
    for pos in decisive["positions"]:
        response = decisive["responses"][pos["response"]]
        key = (tuple(response["prompt_ids"]), tuple(response["response_ids"][: pos["t"]]))
        value = (pos["v_before"], pos["se_before"])
        assert seen.setdefault(key, value) == value


@pytest.mark.slow
def test_a_star_telescopes_to_reward_minus_v0(decisive: dict[str, Any], shipped: tuple[dict[str, Any], Path]) -> None:
    for result in (decisive, shipped[0]):
        by_response: dict[int, list[dict[str, Any]]] = {}
        for pos in result["positions"]:
            by_response.setdefault(pos["response"], []).append(pos)
        assert len(by_response) == len(result["responses"])
        for i, steps in by_response.items():
            response = result["responses"][i]
            assert [p["t"] for p in steps] == list(range(len(response["response_ids"])))
            for before, after in zip(steps, steps[1:], strict=False):
                assert after["v_before"] == before["v_after"] and after["se_before"] == before["se_after"]
            assert steps[-1]["v_after"] == response["reward"] and steps[-1]["se_after"] == 0.0
            total = sum(p["advantage_true"] for p in steps)
            assert total == pytest.approx(response["reward"] - steps[0]["v_before"], abs=1e-12)


def test_v_matches_its_exact_value_when_the_response_can_end_early(tmp_path: Path) -> None:
    """'a' 0.45, 'b' 0.45, EOS 0.1: before the decision V(t) = 0.45 * 0.9^(3-t); after EOS, V = R = 0."""
    result = run_decisive(tmp_path, {"a": 0.45, "b": 0.45, "<eos>": 0.1}, k=256, problems=1, group_size=6)
    checked = 0
    for pos in result["positions"]:
        response = result["responses"][pos["response"]]
        if pos["t"] <= DECISIVE:
            exact = 0.45 * 0.9 ** (DECISIVE - pos["t"])
            assert abs(pos["v_before"] - exact) <= 4 * pos["se_before"]
            checked += 1
        if response["response_ids"][pos["t"]] == 2:  # the EOS ends the response: V after it is its reward
            assert pos["v_after"] == response["reward"] and pos["se_after"] == 0.0
    assert checked > 6
    lengths = [len(r["response_ids"]) for r in result["responses"]]
    assert min(lengths) <= 6 and all(n <= 6 for n in lengths)


def test_grpo_has_no_within_response_correlation(decisive: dict[str, Any], decisive_dir: Path) -> None:
    for name in ("grpo", "dr_grpo", "rloo"):
        assert decisive["estimators"][name]["within_response_spearman"] == [None, None, None]
        assert decisive["estimators"][name]["spearman"][1] is not None  # defined across responses
    rows = {r[0]: r for r in table((decisive_dir / "report.md").read_text(), "estimator")}
    assert rows["grpo"][2] == rows["rloo"][2] == "undefined"
    # float noise of a constant must not turn into a correlation
    x = np.repeat([0.1 + 0.2, 1 / 3, -2 / 7], [5, 7, 3])
    centred = centre_per_response(x, np.array([5, 7, 3]))
    assert (centred == 0).all()
    assert math.isnan(spearman(centred, np.arange(15.0)))


def test_sign_agreement_ignores_float_noise_around_zero() -> None:
    star = np.array([0.5, -0.5, 0.25, -0.25])
    a = np.array([1.0, -1.0, -1e-9, 1e-9])  # noise of the wrong sign on the last two
    assert sign_agreement(a, star) == 0.5
    assert sign_agreement(a, star, zero=1e-6) == 1.0  # the noise counts as 0, not as a wrong sign
    metrics = estimator_metrics(a[None], star, np.full(4, 0.01), np.array([2, 2]))[0]
    assert metrics[METRICS.index("sign_agreement")] == 1.0
    assert math.isnan(sign_agreement(np.zeros(4), star))


def test_top_weights_split_ties_and_mass_share() -> None:
    star = np.array([3.0, 2.0, 2.0, 2.0] + [0.0] * 16)  # top 10% of 20 = 2 tokens: the 3 and 1/3 of each 2
    w = top_weights(star)
    assert w.sum() == pytest.approx(2.0)
    assert w[0] == 1.0 and w[1:4] == pytest.approx([1 / 3] * 3)
    a = np.ones(20)
    assert top_mass_share(a, w) == pytest.approx(0.1)
    assert math.isnan(top_mass_share(np.zeros(20), w))


def test_bootstrap_interval_brackets_the_mean() -> None:
    lengths = np.array([3, 1, 4, 2, 5])
    x = np.arange(15, dtype=float)
    low, high = bootstrap_ci(lambda idx, lens: np.array([x[idx].mean()]), lengths, 300, np.random.default_rng(0))
    assert low[0] < x.mean() < high[0]
    again = bootstrap_ci(lambda idx, lens: np.array([x[idx].mean()]), lengths, 300, np.random.default_rng(0))
    assert (again[0] == low).all()


def test_stratified_positions_by_entropy_decile() -> None:
    mask = torch.ones(4, 25, dtype=torch.bool)
    mask[1, 15:] = False
    entropies = torch.rand(4, 25, generator=torch.Generator().manual_seed(0))
    deciles = entropy_deciles(entropies, mask)
    counts = torch.bincount(deciles[mask], minlength=10)
    assert counts.tolist() == [9] * 10  # 90 tokens, equal counts by rank
    chosen = select_positions(mask, deciles, 3, torch.Generator().manual_seed(1))
    assert torch.bincount(deciles[chosen[:, 0], chosen[:, 1]], minlength=10).tolist() == [3] * 10
    assert mask[chosen[:, 0], chosen[:, 1]].all()
    assert (chosen[1:, 0] * 100 + chosen[1:, 1] > chosen[:-1, 0] * 100 + chosen[:-1, 1]).all()  # sorted


# -- the JSON and the report agree, and the metrics are what they say ------------------------------------


def table(text: str, first_header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table whose first header cell is `first_header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+\.\d+", text)]


def ranks(values: list[float]) -> list[float]:
    """Average ranks by plain sorting: an implementation independent of the module's."""
    order = sorted(values)
    first: dict[float, int] = {}
    count: dict[float, int] = {}
    for i, v in enumerate(order):
        first.setdefault(v, i)
        count[v] = count.get(v, 0) + 1
    return [first[v] + (count[v] - 1) / 2 for v in values]


def plain_spearman(x: list[float], y: list[float]) -> float | None:
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return statistics.correlation(ranks(x), ranks(y))


def recompute(result: dict[str, Any], name: str) -> dict[str, float | None]:
    """Point estimates of the metrics from credit.json's positions alone."""
    pos = result["positions"]
    star = [p["advantage_true"] for p in pos]
    a = [p["advantages"][name] for p in pos]
    by: dict[int, list[int]] = {}
    for j, p in enumerate(pos):
        by.setdefault(p["response"], []).append(j)
    a_c, s_c = [0.0] * len(pos), [0.0] * len(pos)
    for idx in by.values():
        for values, out in ((a, a_c), (star, s_c)):
            vals = [values[j] for j in idx]
            if len(set(vals)) > 1:
                mean = statistics.fmean(vals)
                for j in idx:
                    out[j] = values[j] - mean
    tol = 1e-6 * max(abs(v) for v in a)  # |A| at or below a millionth of the largest counts as 0
    both = [j for j in range(len(pos)) if abs(a[j]) > tol and star[j] != 0]
    sig = [j for j in both if abs(star[j]) > 1.96 * pos[j]["se"]]
    order = sorted(range(len(pos)), key=lambda j: -abs(star[j]))
    m = 0.1 * len(pos)
    cut = abs(star[order[math.ceil(m) - 1]])
    above = [j for j in range(len(pos)) if abs(star[j]) > cut]
    tied = [j for j in range(len(pos)) if abs(star[j]) == cut]
    total = sum(abs(v) for v in a)
    top = sum(abs(a[j]) for j in above) + (m - len(above)) / len(tied) * sum(abs(a[j]) for j in tied)
    return {
        "spearman": plain_spearman(a, star),
        "within_response_spearman": plain_spearman(a_c, s_c),
        "sign_agreement": statistics.fmean([(a[j] > 0) == (star[j] > 0) for j in both]) if both else None,
        "sign_agreement_significant": statistics.fmean([(a[j] > 0) == (star[j] > 0) for j in sig]) if sig else None,
        "top10_mass": top / total if total else None,
    }


@pytest.fixture(params=["decisive", pytest.param("shipped", marks=pytest.mark.slow)])
def run(request: pytest.FixtureRequest) -> tuple[dict[str, Any], Path]:
    """A finished credit run and its folder: the decisive task (fast), the shipped policy (slow)."""
    if request.param == "decisive":
        return request.getfixturevalue("decisive"), request.getfixturevalue("decisive_dir")
    return request.getfixturevalue("shipped")


def test_metrics_match_an_independent_computation(run: tuple[dict[str, Any], Path]) -> None:
    result, _ = run
    names = list(result["estimators"])
    assert names[:8] == ["grpo", "dr_grpo", "rloo", "high_entropy", "entropy_shaping", "gtpo", "erpo", "ep_grpo"]
    for name in names:
        expected = recompute(result, name)
        for metric in METRICS:
            low, estimate, high = result["estimators"][name][metric]
            if expected[metric] is None:
                assert estimate is None, (name, metric)
            else:
                assert estimate == pytest.approx(expected[metric], abs=1e-9), (name, metric)
                assert low is None or low <= estimate + 1e-12
                assert high is None or high >= estimate - 1e-12



@pytest.mark.slow
def test_erpo_ablations_with_the_policy_as_its_own_reference(shipped: tuple[dict[str, Any], Path]) -> None:
    result, _ = shipped
    assert {"erpo:no_gate", "erpo:no_buckets", "erpo:no_anchor", "erpo:no_process"} <= set(result["estimators"])
    assert result["estimators"]["erpo"]["within_response_spearman"][1] is not None  # the gate varies within a response
    # the reference is the policy itself: ERPO's process term is exactly 0, so these coincide
    for pos in result["positions"]:
        assert pos["advantages"]["erpo"] == pos["advantages"]["erpo:no_process"] == pos["advantages"]["erpo:no_anchor"]
        assert pos["advantages"]["erpo:no_gate"] == pytest.approx(pos["advantages"]["grpo"], abs=1e-6)


def test_the_json_matches_the_report(run: tuple[dict[str, Any], Path]) -> None:
    result, out = run
    on_disk = json.loads((out / "credit.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    for key in ("settings", "responses", "positions", "estimators", "entropy_deciles"):
        assert key in on_disk
    assert {"temperature", "max_new_tokens", "k", "task", "model"} <= set(on_disk["settings"])
    for response in on_disk["responses"]:
        assert {"prompt", "prompt_ids", "answer", "response_ids", "reward"} <= set(response)
    for pos in on_disk["positions"]:
        assert {"response", "t", "token_id", "token", "entropy", "v_before", "v_after", "se_before", "se_after",
                "advantage_true", "advantages"} <= set(pos)
        assert pos["advantage_true"] == pytest.approx(pos["v_after"] - pos["v_before"], abs=1e-15)
    report = (out / "report.md").read_text()
    rows = table(report, "estimator")
    assert [r[0] for r in rows] == list(on_disk["estimators"])
    for row in rows:
        metrics = on_disk["estimators"][row[0]]
        for cell_text, metric in zip(row[1:], METRICS, strict=True):
            low, estimate, high = metrics[metric]
            if estimate is None:
                assert cell_text == "undefined"
            else:
                shown = numbers(cell_text)
                assert shown == pytest.approx([v for v in (estimate, low, high) if v is not None], abs=5e-4)
    deciles = table(report, "decile")
    for row, decile in zip(deciles, on_disk["entropy_deciles"]["deciles"], strict=True):
        assert int(row[0]) == decile["decile"] and int(row[2]) == decile["positions"]
        low, estimate, high = decile["mean_abs_advantage_true"]
        if estimate is not None:
            assert numbers(row[3]) == pytest.approx([estimate, low, high], abs=5e-4)
        # the decile's mean |A*| re-derived from the positions
        members = [abs(p["advantage_true"]) for p in on_disk["positions"] if p["decile"] == decile["decile"] - 1]
        assert decile["positions"] == len(members)
        if members:
            assert estimate == pytest.approx(statistics.fmean(members), abs=1e-12)
            bound = statistics.fmean(1 - math.exp(p["logprob"]) for p in on_disk["positions"]
                                     if p["decile"] == decile["decile"] - 1)
            assert decile["bound_mean"] == pytest.approx(bound, abs=1e-12)
            assert float(row[6]) == pytest.approx(bound, abs=5e-4)
    ratio = on_disk["entropy_deciles"]["top_bottom_ratio"]
    line = next(line for line in report.splitlines() if line.startswith("Ratio of mean |A*|"))
    if ratio[1] is not None:
        assert numbers(line) == pytest.approx([v for v in (ratio[1], ratio[0], ratio[2]) if v is not None], abs=5e-3)
    for name in ("entropy_deciles.png", "estimators.png"):
        with Image.open(out / name) as img:
            img.verify()


@pytest.mark.slow
def test_the_html_has_a_row_per_chosen_estimator(shipped: tuple[dict[str, Any], Path]) -> None:
    result, out = shipped
    page = (out / "tokens.html").read_text()
    assert page.count('class="resp"') == len(result["responses"])
    # rows: entropy, A*, then grpo, erpo, gtpo; one span per token in each
    tokens = sum(len(r["response_ids"]) for r in result["responses"])
    assert page.count('class="tok"') == 5 * tokens
    assert page.count('<span class="lab">A*</span>') == len(result["responses"])


def test_sampled_positions_estimate_only_what_they_need(tmp_path: Path) -> None:
    result = run_decisive(tmp_path, {"a": 0.5, "b": 0.5}, k=8, positions_per_decile=1)
    assert 1 <= len(result["positions"]) <= 10
    decile_counts = [d["positions"] for d in result["entropy_deciles"]["deciles"]]
    assert sum(decile_counts) == len(result["positions"])
    assert result["summary"]["prefixes"] <= 2 * len(result["positions"])
    page = (tmp_path / "tokens.html").read_text()
    assert "not estimated" in page


def test_cli_rejects_bad_input_with_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, needle in ((["-k", "1"], "-k"), (["--task", "nope"], "nope"), (["-n", "0"], "-n"),
                         (["--html-estimators", "grpo,erpp"], "erpp"), (["--positions", "0"], "--positions"),
                         (["--temperature", "0"], "temperature")):
        res = runner.invoke(app, ["credit", "-n", "1", "-g", "2", "-o", str(tmp_path), *args])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output and "Traceback" not in res.output


def test_pivot_mc_is_scored_and_its_credit_lands_on_the_deciding_tokens_segment(tmp_path: Path) -> None:
    """A real (constructed) policy: a fair coin at every position, the reward decided at DECISIVE only."""
    result = run_decisive(tmp_path, {"a": 0.5, "b": 0.5}, k=2, problems=2, pivots=2, branches=16)
    assert "pivot_mc" in result["estimators"] and result["settings"]["pivot_mc"]["branch_tokens"] > 0
    by_t: dict[int, list[float]] = {}
    for pos in result["positions"]:
        by_t.setdefault(pos["t"], []).append(abs(pos["advantages"]["pivot_mc"]))
    mean_abs = {t: sum(v) / len(v) for t, v in by_t.items()}
    assert max(mean_abs, key=mean_abs.get) == DECISIVE or mean_abs[DECISIVE] == pytest.approx(max(mean_abs.values()))
    assert mean_abs[DECISIVE] > 2 * max(mean_abs[0], mean_abs[max(mean_abs)])


def test_the_default_batch_holds_the_key_value_cache_it_measures() -> None:
    from pivotrl.analysis.credit import MOST_BATCH_ROWS, rows_that_fit

    config = LlamaConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    rows, length = 3, 7
    with torch.no_grad():
        cache = model(torch.zeros(rows, length, dtype=torch.long), use_cache=True).past_key_values
    layers = [cache.layers[i] for i in range(config.num_hidden_layers)]
    measured = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    per_row = measured // rows
    assert rows_that_fit(model, length, budget_bytes=5 * per_row) == 5
    assert rows_that_fit(model, length, budget_bytes=5 * per_row - 1) == 4
    assert rows_that_fit(model, length, budget_bytes=1) == 1
    assert rows_that_fit(model, length, budget_bytes=10**15) == MOST_BATCH_ROWS

"""Rows over a size bound are skipped and counted before they are parsed or tokenised; memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pivotrl.tasks import benchmarks_dir, get_task, read_rows
from pivotrl.tasks.loaders import MAX_ROW_CHARS, rows_to_problems


def test_read_rows_skips_lines_over_the_bound_without_holding_them(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    fits = json.dumps({"question": "q" * 33, "answer": "1"})
    assert len(fits) == 64
    path.write_text("\n".join([fits, json.dumps({"question": "x" * 5000, "answer": "2"}), "{not json", fits]) + "\n")
    rows, skipped = read_rows(path, max_chars=64)
    assert len(rows) == 2 and skipped == {"longer than 64 characters": 1, "not valid JSON": 1}
    rows, skipped = read_rows(path, max_chars=63)  # one character less: every row is over
    assert rows == [] and skipped["longer than 63 characters"] == 3


def test_rows_from_other_formats_are_bounded_by_question_plus_answer() -> None:
    rows = [{"q": "short", "a": "1"}, {"q": "y" * 100, "a": "2"}, {"q": "", "a": "3"}]
    problems = rows_to_problems(rows, question_field="q", answer_field="a", source="rows", max_chars=50)
    assert [p.prompt for p in problems] == ["short"] and problems.skipped == 2


def test_no_benchmark_row_reaches_the_default_bound() -> None:
    try:
        folder = benchmarks_dir()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    longest = max(len(line.rstrip("\n")) for f in folder.glob("*.jsonl") for line in f.open(encoding="utf-8"))
    assert longest < MAX_ROW_CHARS / 5, longest
    for name in ("gsm8k", "math500", "aime24", "amc23"):
        assert get_task(name).problems("test").skipped == 0


MEASURE = textwrap.dedent("""
    import resource, subprocess, sys
    proc = subprocess.run([sys.executable, "-m", "pivotrl.cli", *sys.argv[1:]], capture_output=True, text=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(proc.returncode, peak_kib)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
""")


@pytest.mark.slow
def test_eval_on_a_file_with_one_huge_line_stays_small(tmp_path: Path) -> None:
    data = tmp_path / "problems.jsonl"
    long_question = "What is 7 times 6? " * 60  # about 1 100 characters: longer than the tiny model's 256 positions
    with data.open("w") as f:
        f.write(json.dumps({"question": "What is 2 + 2?", "answer": "4"}) + "\n")
        f.write('{"question": "' + "9" * 30_000_000 + '", "answer": "1"}\n')  # one 30 MB line
        f.write(json.dumps({"question": long_question, "answer": "42"}) + "\n")
        f.write(json.dumps({"question": "What is 3 + 5?", "answer": "8"}) + "\n")
    samples = tmp_path / "samples.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, "eval", "--model", "tiny", "--data", str(data), "--max-new-tokens", "2",
         "--batch-size", "1", "-o", str(samples)],
        capture_output=True, text=True, timeout=600)
    code, peak_kib = (int(v) for v in proc.stdout.split("\n", 1)[0].split())
    output = proc.stdout.split("\n", 1)[1]
    assert code == 0, proc.stderr
    assert peak_kib < 3 * 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    result = json.loads(output)
    assert result["num_problems"] == 3 and result["skipped_rows"] == 1
    assert len(samples.read_text().splitlines()) == 3
    assert f"skipped 1 row(s): 1 longer than {MAX_ROW_CHARS} characters" in proc.stderr
    assert "evaluating: 1/3 problems" in proc.stderr  # progress of a multi-batch evaluation
    for noise in ("Loading weights", "Token indices sequence length", "Traceback"):
        assert noise not in proc.stderr, proc.stderr

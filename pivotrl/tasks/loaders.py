"""Tasks read from files or a dataset hub: GSM8K, MATH-500, AIME 2024, AMC 2023, any jsonl/parquet.

The benchmark files are found in the folder named by the environment
variable ``PIVOTRL_BENCHMARKS``, else ``../shared/data/benchmarks`` relative
to the current directory, else relative to the repository root (the folder
above the installed package). Rows that cannot be used (a missing or empty
question or answer) are skipped; their count is logged as a warning and kept
as ``problems.skipped``. A source with no usable row raises ValueError.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pivotrl.tasks.base import (
    Problem,
    ProblemList,
    Task,
    Verifier,
    lazy_verifier,
    register_task,
)

logger = logging.getLogger("pivotrl.tasks")

BENCHMARKS_ENV = "PIVOTRL_BENCHMARKS"
_DEFAULT_RELATIVE = Path("..") / "shared" / "data" / "benchmarks"

MATH_INSTRUCTION = (
    "Think step by step inside <think> </think>, then give only the final answer "
    "inside <answer> </answer>."
)


def benchmarks_dir() -> Path:
    """The benchmark folder: ``$PIVOTRL_BENCHMARKS``, else ``../shared/data/benchmarks``.

    The relative default is tried from the current directory, then from the
    repository root. Raises FileNotFoundError naming every path tried.
    """
    env = os.environ.get(BENCHMARKS_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"benchmark folder {path} (from ${BENCHMARKS_ENV}) does not exist"
            )
        return path
    repo_root = Path(__file__).resolve().parents[2]
    tried = []
    for base in (Path.cwd(), repo_root):
        path = (base / _DEFAULT_RELATIVE).resolve()
        tried.append(str(path))
        if path.is_dir():
            return path
    raise FileNotFoundError(
        f"no benchmark folder: tried {', '.join(dict.fromkeys(tried))}; "
        f"set ${BENCHMARKS_ENV} to the folder holding the benchmark jsonl files"
    )


# -- reading rows ------------------------------------------------------------


#: Longest row a file task reads, in characters (task option ``max_chars``). The longest
#: row of the benchmark files is 11 195 characters (an AIME 2024 line with its solution);
#: a row over the bound is skipped and counted before it is parsed or tokenised.
MAX_ROW_CHARS = 100_000


def read_rows(path: str | os.PathLike[str], *, max_chars: int | None = None) -> tuple[list[Any], Counter[str]]:
    """The rows of a ``.jsonl``/``.json``/``.parquet`` file, and the count of lines skipped, by reason.

    A jsonl line that is not valid JSON, or (with ``max_chars``) longer than ``max_chars``
    characters, is skipped; an over-long line is never held in memory whole. Parquet needs
    pyarrow (or pandas), imported only here. A file that is not UTF-8 text (or valid
    parquet) raises ValueError naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}" if not path.exists() else f"{path} is not a file")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    skipped: Counter[str] = Counter()
    try:
        if suffix in (".parquet", ".pq"):
            return _read_parquet(path), skipped
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):  # {"data": [...]} or {"rows": [...]}
                data = next((v for v in data.values() if isinstance(v, list)), [data])
            return list(data) if isinstance(data, list) else [data], skipped
        rows: list[Any] = []
        limit = max_chars + 1 if max_chars is not None else -1
        with path.open(encoding="utf-8") as f:
            while line := f.readline(limit):
                if max_chars is not None and len(line.rstrip("\n")) > max_chars:
                    while line and not line.endswith("\n"):  # drop the rest of it, a bounded chunk at a time
                        line = f.readline(limit)
                    skipped[f"longer than {max_chars} characters"] += 1
                    continue
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    skipped["not valid JSON"] += 1
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); expected jsonl, json or parquet") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow/pandas raise their own types for a damaged parquet file
        if suffix not in (".parquet", ".pq"):
            raise
        raise ValueError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None
    return rows, skipped


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"reading {path} needs pyarrow (or pandas): pip install pyarrow"
            ) from None
        return pd.read_parquet(path).to_dict(orient="records")
    return pq.read_table(path).to_pylist()


def _field(row: Any, name: str) -> Any:
    """``row[name]``, where ``name`` may be dotted (``"reward_model.ground_truth"``)."""
    value = row
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def answer_text(value: Any) -> str | None:
    """An answer as a string, or None when empty/missing. ``27.0`` -> ``"27"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return str(int(value))
        return repr(value)
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            return None
        return answer_text(value[0])
    text = str(value).strip()
    return text or None


def gsm8k_answer(solution: str) -> str | None:
    """The number after ``####`` in a GSM8K solution (commas dropped), or None."""
    if "####" not in solution:
        return None
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return final or None


def rows_to_problems(
    rows: Iterable[Any],
    *,
    question_field: str,
    answer_field: str,
    answer_transform: Callable[[str], str | None] | None = None,
    source: str,
    unreadable: int | Mapping[str, int] = 0,
    keep_fields: Iterable[str] = (),
    max_chars: int | None = None,
) -> ProblemList:
    """Problems from rows; rows with a missing/empty question or answer, or (with ``max_chars``) a
    question plus answer longer than ``max_chars`` characters, are skipped and counted.

    ``unreadable`` counts rows the reader already dropped: a number, or counts by reason.
    """
    problems: list[Problem] = []
    skipped: Counter[str] = Counter(unreadable) if isinstance(unreadable, Mapping) else Counter(
        {"unreadable": unreadable} if unreadable else {})
    keep = tuple(keep_fields)
    seen_fields: set[str] = set()
    total = 0
    for index, row in enumerate(rows):
        total += 1
        if isinstance(row, Mapping) and len(seen_fields) < 50:
            seen_fields.update(str(k) for k in row)
        question = _field(row, question_field)
        question = question.strip() if isinstance(question, str) else None
        raw_answer = _field(row, answer_field)
        if max_chars is not None and len(question or "") + len(str(raw_answer or "")) > max_chars:
            skipped[f"longer than {max_chars} characters"] += 1
            continue
        answer = answer_text(raw_answer)
        if answer is not None and answer_transform is not None:
            answer = answer_transform(answer)
        if not question or not answer:
            skipped[f"missing or empty {question_field!r}/{answer_field!r}"] += 1
            continue
        meta: dict[str, Any] = {"index": index, "source": source}
        for name in keep:
            value = _field(row, name)
            if value is not None:
                meta[name] = value
        problems.append(Problem(prompt=question, answer=answer, meta=meta))
    count = sum(skipped.values())
    why = ", ".join(f"{n} {reason}" for reason, n in skipped.items())
    if count and problems:
        logger.warning("%s: skipped %d row(s): %s", source, count, why)
    if not problems:
        if total == 0 and not count:
            raise ValueError(f"{source}: no usable rows: the file is empty")
        fields = f"; its rows have the fields {', '.join(sorted(seen_fields))}" if seen_fields else ""
        raise ValueError(
            f"{source}: no usable rows (need a non-empty {question_field!r} and {answer_field!r}; "
            f"skipped {count}: {why}){fields}"
        )
    return ProblemList(problems, source=source, skipped=count)


# -- verifiers by name ---------------------------------------------------------

_VERIFIERS: dict[str, tuple[str, str]] = {
    "math": ("pivotrl.rewards", "math_reward"),
    "arithmetic": ("pivotrl.rewards", "arithmetic_reward"),
    "countdown": ("pivotrl.rewards", "countdown_reward"),
    "format": ("pivotrl.rewards", "format_reward"),
}


def resolve_verifier(verifier: str | Verifier) -> Verifier:
    """A verifier from a name (``math``, ``arithmetic``, ``countdown``, ``format``),
    a dotted path ``module:function``, or a callable."""
    if callable(verifier):
        return verifier
    if verifier in _VERIFIERS:
        return lazy_verifier(*_VERIFIERS[verifier])
    if ":" in verifier:
        module, name = verifier.split(":", 1)
        return lazy_verifier(module, name)
    raise ValueError(
        f"unknown verifier {verifier!r}: use one of {sorted(_VERIFIERS)}, 'module:function' or a callable"
    )


# -- tasks --------------------------------------------------------------------


class FileTask(Task):
    """Problems from a jsonl/json/parquet file (or one file per split).

    Options: ``path`` (one file used for every split, or a mapping
    ``{"train": ..., "test": ...}``), ``question_field`` / ``answer_field``
    (dotted names reach into nested fields), ``answer_after`` (keep only the
    text after this marker, e.g. ``"####"`` for GSM8K-style solutions),
    ``verifier`` (``"math"`` by default; see :func:`resolve_verifier`),
    ``limit`` (keep at most this many problems), ``max_chars`` (skip and count rows
    longer than this many characters, checked before parsing or tokenising; default
    :data:`MAX_ROW_CHARS`; None: no bound).
    """

    name = "file"
    max_new_tokens = 1024  # a worked math solution: hundreds of tokens, often more
    instruction = MATH_INSTRUCTION
    template = "{prompt}\n{instruction}\n"

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
        question_field: str = "question",
        answer_field: str = "answer",
        answer_after: str | None = None,
        verifier: str | Verifier = "math",
        limit: int | None = None,
        keep_fields: Iterable[str] = (),
        max_chars: int | None = MAX_ROW_CHARS,
        **task_options: Any,
    ):
        super().__init__(verifier=resolve_verifier(verifier), **task_options)
        if max_chars is not None and (not isinstance(max_chars, int) or max_chars < 1):
            raise ValueError(f"max_chars must be a positive number of characters or None, got {max_chars!r}")
        self.max_chars = max_chars
        if isinstance(path, Mapping):
            from pivotrl.tasks.base import normalize_split

            self.paths = {normalize_split(k): Path(v) for k, v in path.items()}
        else:
            self.paths = {"train": Path(path), "test": Path(path)}
        self.question_field = question_field
        self.answer_field = answer_field
        self.answer_after = answer_after
        self.limit = limit
        self.keep_fields = tuple(keep_fields)

    def _transform(self) -> Callable[[str], str | None] | None:
        marker = self.answer_after
        if marker is None:
            return None
        if marker == "####":
            return gsm8k_answer

        def after(text: str) -> str | None:
            return text.rsplit(marker, 1)[1].strip() or None if marker in text else None

        return after

    def _load(self, split: str) -> ProblemList:
        if split not in self.paths:
            raise ValueError(
                f"task {self.name!r} has no {split!r} split (it has {sorted(self.paths)})"
            )
        path = self.paths[split]
        rows, unreadable = read_rows(path, max_chars=self.max_chars)
        problems = rows_to_problems(
            rows,
            question_field=self.question_field,
            answer_field=self.answer_field,
            answer_transform=self._transform(),
            source=str(path),
            unreadable=unreadable,
            keep_fields=self.keep_fields,
            max_chars=self.max_chars,
        )
        if self.limit is not None:
            problems = ProblemList(
                problems[: self.limit], source=problems.source, skipped=problems.skipped
            )
        return problems


register_task("file")(FileTask)


class _BenchmarkTask(FileTask):
    """A benchmark file in :func:`benchmarks_dir`."""

    files: dict[str, str] = {}
    fields: tuple[str, str] = ("question", "answer")
    answer_after: str | None = None
    keep: tuple[str, ...] = ()

    def __init__(self, *, directory: str | os.PathLike[str] | None = None, **options: Any):
        self.directory = Path(directory) if directory is not None else None
        options.setdefault("question_field", self.fields[0])
        options.setdefault("answer_field", self.fields[1])
        options.setdefault("answer_after", type(self).answer_after)
        options.setdefault("keep_fields", self.keep)
        # paths are resolved when first read, so building the task never fails
        super().__init__(path=dict(self.files), **options)

    def _load(self, split: str) -> ProblemList:
        if split not in self.paths:
            raise ValueError(
                f"task {self.name!r} has no {split!r} split (it has {sorted(self.paths)}); "
                "it is an evaluation set"
            )
        folder = self.directory if self.directory is not None else benchmarks_dir()
        path = folder / self.paths[split]
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark file {path} not found; set ${BENCHMARKS_ENV} to the folder holding it"
            )
        saved = dict(self.paths)
        self.paths = {split: path}
        try:
            return super()._load(split)
        finally:
            self.paths = saved


@register_task("gsm8k")
class GSM8KTask(_BenchmarkTask):
    """GSM8K: ``gsm8k_train.jsonl`` / ``gsm8k_test.jsonl``; the answer is the number after ``####``."""

    name = "gsm8k"
    max_new_tokens = 1024  # configs/gpu/qwen2.5-math-1.5b-gsm8k-erpo.yaml's rollout length
    files = {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}
    fields = ("question", "answer")
    answer_after = "####"


class _CompetitionTask(_BenchmarkTask):
    """A test-only competition-math benchmark: long worked solutions."""

    max_new_tokens = 3072  # the Qwen2.5-Math recipes' rollout length (configs/gpu/)
    fields = ("problem", "answer")


@register_task("math500")
class Math500Task(_CompetitionTask):
    """MATH-500 (test only): ``problem`` / ``answer`` of ``math500.jsonl``."""

    name = "math500"
    files = {"test": "math500.jsonl"}
    keep = ("subject", "level", "unique_id")


@register_task("aime24")
class AIME24Task(_CompetitionTask):
    """AIME 2024 I and II (test only): ``problem`` / ``answer`` of ``aime24.jsonl``."""

    name = "aime24"
    files = {"test": "aime24.jsonl"}
    keep = ("id",)


@register_task("amc23")
class AMC23Task(_CompetitionTask):
    """AMC 2023 (test only): ``question`` / ``answer`` of ``amc23.jsonl`` (``27.0`` -> ``"27"``)."""

    name = "amc23"
    files = {"test": "amc23.jsonl"}
    fields = ("question", "answer")
    keep = ("id",)


@register_task("hub")
class HubTask(FileTask):
    """A dataset from a hub, through the ``datasets`` library (imported only when loading).

    Options: ``dataset`` (the hub id or a local dataset folder), ``config``
    (the dataset's configuration name), ``splits`` (mapping from ``train``/``test``
    to the dataset's split names, default ``{"train": "train", "test": "test"}``),
    ``load_options`` (more keyword arguments of ``datasets.load_dataset``, e.g.
    ``{"data_files": ...}`` with ``dataset="json"`` for local files), plus the
    field, answer and verifier options of the ``file`` task.
    Offline or without ``datasets``, loading raises a RuntimeError/ImportError
    that says so.
    """

    name = "hub"

    def __init__(
        self,
        *,
        dataset: str,
        config: str | None = None,
        splits: Mapping[str, str] | None = None,
        load_options: Mapping[str, Any] | None = None,
        **options: Any,
    ):
        from pivotrl.tasks.base import normalize_split

        super().__init__(path={"train": dataset, "test": dataset}, **options)
        self.dataset = dataset
        self.config = config
        self.load_options = dict(load_options or {})
        self.splits = {
            normalize_split(k): v for k, v in (splits or {"train": "train", "test": "test"}).items()
        }

    def _load(self, split: str) -> ProblemList:
        if split not in self.splits:
            raise ValueError(
                f"hub task {self.dataset!r} has no {split!r} split mapped (have {self.splits})"
            )
        try:
            import datasets
        except ImportError:
            raise ImportError(
                f"loading the hub dataset {self.dataset!r} needs the 'datasets' package: "
                "pip install datasets (or download the data and use task='file', path=...)"
            ) from None
        name = self.splits[split]
        try:
            data = datasets.load_dataset(self.dataset, self.config, split=name, **self.load_options)
        except Exception as exc:  # offline, unknown id, missing split...
            raise RuntimeError(
                f"could not load {self.dataset!r} (config={self.config!r}, split={name!r}) "
                f"from the hub: {exc}. Offline? Download it and use task='file', path=..."
            ) from exc
        return rows_to_problems(
            data,
            question_field=self.question_field,
            answer_field=self.answer_field,
            answer_transform=self._transform(),
            source=f"hub:{self.dataset}[{name}]",
            keep_fields=self.keep_fields,
            max_chars=self.max_chars,
        )

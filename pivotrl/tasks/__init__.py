"""Tasks: problems with reference answers, a verifier and a prompt template.

>>> from pivotrl.tasks import get_task
>>> task = get_task("countdown", test_size=100)
>>> p = task.problems("test")[0]
>>> task.format_prompt(p)            # what the model sees      # doctest: +SKIP
'Use 3 5 7 to make 22.\\n'
>>> task.verifier(completion, p.answer)                         # doctest: +SKIP
1.0

Registered: ``countdown``, ``countdown_free``, ``countdown_search``, ``arithmetic``, ``linear``
(synthetic, with a fixed hash-defined held-out split and worked solutions), ``gsm8k``, ``math500``,
``aime24``, ``amc23`` (benchmark files), ``file`` (any jsonl/parquet) and
``hub`` (a dataset hub id through ``datasets``).
"""

from pivotrl.tasks.base import (
    FORMAT_INSTRUCTION,
    TASKS,
    Problem,
    ProblemList,
    Task,
    get_task,
    layout,
    normalize_split,
    register_task,
)
from pivotrl.tasks.loaders import (
    BENCHMARKS_ENV,
    FileTask,
    HubTask,
    benchmarks_dir,
    gsm8k_answer,
    read_rows,
)
from pivotrl.tasks.search import CountdownSearchTask, SearchTrace
from pivotrl.tasks.synthetic import (
    FLAWS,
    ArithmeticTask,
    CountdownFreeTask,
    CountdownTask,
    LinearTask,
    SyntheticTask,
    WorkedSolution,
)

__all__ = [
    "BENCHMARKS_ENV",
    "FLAWS",
    "FORMAT_INSTRUCTION",
    "TASKS",
    "ArithmeticTask",
    "CountdownFreeTask",
    "CountdownSearchTask",
    "CountdownTask",
    "FileTask",
    "HubTask",
    "LinearTask",
    "Problem",
    "ProblemList",
    "SearchTrace",
    "SyntheticTask",
    "Task",
    "WorkedSolution",
    "benchmarks_dir",
    "get_task",
    "gsm8k_answer",
    "layout",
    "normalize_split",
    "read_rows",
    "register_task",
]

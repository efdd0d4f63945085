"""Keep the records of finished runs where git keeps them: everything a run folder holds but its checkpoints.

    .venv/bin/python scripts/keep_runs.py runs/cd_erpo [more compare folders] -o docs/experiments/smollm2_countdown/runs

A session's run folders live on its machine and go with it; their records (config.yaml, metrics.jsonl,
summary.json, eval/: the held-out results and every held-out sample) are what scripts/ceilings.py and
scripts/heldout_paired.py read, a few hundred kB a run. For each compare folder given, each run that has
finished (its summary.json is written last) is copied to OUTPUT/<folder's name>/runs/<run's name>/, so that
the analyses run on OUTPUT/<folder's name> as on the folder itself. Runs not finished are skipped and named.
A record already kept is left as it is when identical, and refused (exit 1, nothing written) when it differs.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
from pathlib import Path

RECORDS = ("config.yaml", "metrics.jsonl", "summary.json")


def record_files(run: Path) -> list[Path]:
    """A finished run's records, relative to the run folder: RECORDS and every file under eval/."""
    files = [Path(name) for name in RECORDS if (run / name).is_file()]
    if (run / "eval").is_dir():
        files += sorted(p.relative_to(run) for p in (run / "eval").rglob("*") if p.is_file())
    return files


def plan(folders: list[Path], output: Path) -> tuple[list[tuple[str, Path, Path]], list[str], list[str]]:
    """(run, source, destination) to copy, runs skipped as unfinished, and records that differ from what is kept."""
    copies, unfinished, conflicts = [], [], []
    for folder in folders:
        name = folder.resolve().name
        for run in sorted(p for p in (folder / "runs").iterdir() if p.is_dir()):
            if not (run / "summary.json").is_file():
                unfinished.append(str(run))
                continue
            for rel in record_files(run):
                source, target = run / rel, output / name / "runs" / run.name / rel
                if not target.exists():
                    copies.append((f"{name}/{run.name}", source, target))
                elif not filecmp.cmp(source, target, shallow=False):
                    conflicts.append(str(target))
    return copies, unfinished, conflicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="pivotrl compare output folders (each with runs/)")
    parser.add_argument("-o", "--output-dir", type=Path, required=True, help="where the records go (in the repository)")
    args = parser.parse_args()
    for folder in args.folders:
        if not (folder / "runs").is_dir():
            parser.error(f"{folder} is not a pivotrl compare folder (no runs/)")
    names = [folder.resolve().name for folder in args.folders]
    if len(set(names)) < len(names):
        parser.error(f"two folders share a name ({', '.join(names)}): their records would land in one place")
    if args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"--output-dir {args.output_dir} is a file")
    copies, unfinished, conflicts = plan(args.folders, args.output_dir)
    for run in unfinished:
        print(f"skipping {run}: not finished (no summary.json)")
    if conflicts:
        print("refusing: these records are kept already with other contents (nothing written):\n  "
              + "\n  ".join(conflicts), file=sys.stderr)
        return 1
    for _, source, target in copies:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    runs = sorted({run for run, _, _ in copies})
    size = sum(source.stat().st_size for _, source, _ in copies)
    print(f"kept {len(copies)} files ({size / 1e3:,.0f} kB) of {len(runs)} runs in {args.output_dir}"
          + (f": {', '.join(runs)}" if runs else " (everything finished was kept already)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

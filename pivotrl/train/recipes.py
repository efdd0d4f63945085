"""Where the shipped YAML recipes live."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # shipped in the package; configs/ at the repo root links here


def default_config_path() -> Path:
    """configs/default.yaml, the main job."""
    return recipe_path("default")


def recipe_path(name: str) -> Path:
    """The path of a shipped recipe by name (e.g. 'smoke', 'erpo')."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no recipe {name!r} in {CONFIG_DIR}; known: {known}")
    return path


def shipped_recipes() -> list[str]:
    """The names of the shipped training recipes ('default', 'grpo', 'gpu/qwen2.5-math-1.5b-erpo', ...)."""
    names = (str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in CONFIG_DIR.rglob("*.yaml"))
    return sorted(n for n in names if not n.startswith("verl/"))  # verl/ holds verl's recipes, not pivotrl train's


def find_recipe(given: str | Path) -> Path:
    """The recipe file `given` names, from any folder: a YAML file's path, or a shipped recipe by its
    name ('grpo', 'gpu/qwen2.5-math-1.5b-erpo'), also written as configs/NAME.yaml. A name that is
    neither comes back as it was given (the caller says it does not exist)."""
    path = Path(given)
    if path.exists():
        return path
    name = str(given).removeprefix("configs/").removesuffix(".yaml").removesuffix(".yml")
    shipped = CONFIG_DIR / f"{name}.yaml"
    return shipped if shipped.is_file() else path

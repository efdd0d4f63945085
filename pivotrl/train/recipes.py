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

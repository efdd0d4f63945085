"""The prompt form a model was trained in, kept beside its weights.

A model pivotrl writes (a warm start, a training run's checkpoint) records whether it saw its prompts
through the tokenizer's chat template (:data:`PROMPT_FORM_FILE`), so that ``pivotrl eval``,
``analyze``, ``credit`` and ``train`` give it prompts in that form unless told otherwise
(``--chat`` / ``--no-chat``, ``model.chat_template``). A model with no record gets plain prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The recipe file of a warm start (pivotrl.warm_start.RECIPE_FILE).
WARM_START_RECIPE = "warm_start.json"
#: The file beside a model's weights that records its prompt form: {"chat": true}.
PROMPT_FORM_FILE = "prompt_form.json"


def save_prompt_form(folder: str | Path, chat: bool) -> None:
    """Record in `folder` (a model folder) that the model was trained on prompts in chat form (or plain)."""
    (Path(folder) / PROMPT_FORM_FILE).write_text(json.dumps({"chat": bool(chat)}) + "\n")


def saved_prompt_form(name_or_path: str) -> bool | None:
    """Whether the model `name_or_path` (a warm start's name, a model folder or a run folder) was trained
    on chat prompts, as recorded beside its weights; None where nothing is recorded (a shipped tiny policy,
    a hub id, a GGUF model as it comes, a warm start not made yet)."""
    from pivotrl.modeling.policy import model_in_folder
    from pivotrl.modeling.warm_names import WARM_STARTS, warm_start_folder

    folder = warm_start_folder(name_or_path) if name_or_path in WARM_STARTS else Path(name_or_path)
    if not folder.is_dir():
        return None
    try:
        folder = Path(model_in_folder(str(folder)))
    except ValueError:
        return None
    record = folder / PROMPT_FORM_FILE
    if not record.is_file():  # a warm start made before the record: warm starts always train in chat form
        return True if (folder / WARM_START_RECIPE).is_file() else None
    return bool(json.loads(record.read_text())["chat"])


def prompt_form(name_or_path: str, chat: bool | None) -> bool:
    """The prompt form to use: `chat` where the user chose one, else the model's recorded form, else plain."""
    if chat is not None:
        return chat
    return bool(saved_prompt_form(name_or_path))

"""Every error pivotrl raises on purpose, in one place low in the house (it imports nothing of pivotrl).

The command line prints the message of a ConfigError or CheckpointError as one `error:` line
(exit code 2); TrainingInterrupted exits with 130; TrainingAborted names the intact checkpoint.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config problem, with the dotted key it concerns in the message."""


class FolderBusy(ConfigError):
    """Another process holds the folder's lock."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (damaged, or not readable without running code); names the file."""


class TrainingAborted(RuntimeError):
    """The run stopped on purpose (e.g. repeated NaN losses); the last checkpoint is intact."""


class SamplerMismatch(TrainingAborted):
    """rollout/logprob_diff stayed above rollout.max_logprob_diff for rollout.logprob_diff_patience steps."""


class TrainingInterrupted(RuntimeError):
    """Ctrl-C stopped the run; the message says which checkpoint to resume from."""

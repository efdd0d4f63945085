"""The trainer: config, the step loop, checkpoints and loggers."""

from pivotrl.errors import ConfigError
from pivotrl.train.config import RunConfig, load_config

__all__ = ["ConfigError", "RunConfig", "load_config"]

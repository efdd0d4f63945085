"""The trainer: config, the step loop, checkpoints and loggers."""

from pivotrl.train.config import ConfigError, RunConfig, load_config

__all__ = ["ConfigError", "RunConfig", "load_config"]

"""pivotrl: token-level credit assignment for RL from verifiable rewards."""

__version__ = "0.1.0"

"""The incumbent attention target."""
from engine.attention.kernel import attend

__all__ = ["attend"]

"""A candidate attention implementation."""
from fast_attn.kernel import attend
import fast_attn.util

__all__ = ["attend", "fast_attn"]

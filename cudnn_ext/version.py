"""The library version (a leaf module: plan headers record it)."""

__version__ = "0.1.0"

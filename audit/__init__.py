"""audit: experiment registry and waste audit for post-training teams."""

__version__ = "0.1.0"

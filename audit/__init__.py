"""audit: experiment registry and waste audit for post-training teams."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use so that `audit --help` stays fast.
    if name == "Registry":
        from audit.query.registry import Registry

        return Registry
    if name == "gate":
        from audit.actions.gate import gate

        return gate
    raise AttributeError(name)

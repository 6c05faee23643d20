"""Reward functions used by the end-to-end tests (loaded as `rewards_for_tests:NAME`)."""


def digit_share(completion: str, item) -> float:
    """Share of characters that are digits: a tiny random model can learn to raise it."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))

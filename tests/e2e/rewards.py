"""A reward with spread on a random tiny model (the arithmetic checker gives it 0 almost always):
the fraction of digits in the completion. Used by the system tests through task.reward.custom."""


def digit_fraction(completion: str, row) -> float:
    return sum(c.isdigit() for c in completion) / max(1, len(completion))

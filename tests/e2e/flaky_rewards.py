"""A reward function that fails on some completions, deterministically (by the sum of their
character codes): it raises for a fifth of them, returns a non-number for another fifth, and
scores the fraction of digits otherwise. The job must isolate and count both failures
(task.reward.on_failure: zero) and train on."""


def flaky(completion: str, row) -> float:
    code = sum(map(ord, completion)) % 5
    if code == 0:
        raise ValueError("flaky reward: cannot score this completion")
    if code == 1:
        return "not a number"  # type: ignore[return-value]
    return sum(c.isdigit() for c in completion) / max(1, len(completion))

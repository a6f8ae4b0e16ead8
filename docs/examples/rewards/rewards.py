"""The reward functions of docs/rewards.md's example: one in TRL's batched form, one per completion.

Run from the repository root:

    stabledrl train --config docs/examples/rewards/job.yaml
"""


def exact(prompts, completions, answer, **kwargs):
    """TRL's form: keyword lists, one item per completion; 1 for the reversed word, else 0."""
    return [1.0 if completion.strip() == target else 0.0 for completion, target in zip(completions, answer)]


def hard_words(completions, level, answer, **kwargs):
    """Applies to the hard (four-letter) words only: None, "not applicable", for the others. A
    share of the letters in place, so a near miss on a hard word still earns something."""
    scores = []
    for completion, target, kind in zip(completions, answer, level):
        if kind != "hard":
            scores.append(None)
            continue
        text = completion.strip()
        scores.append(sum(a == b for a, b in zip(text, target)) / len(target))
    return scores


def brevity(completion, row):
    """The project's per-completion form: -0.1 for each character beyond the answer's length."""
    return -0.1 * max(0, len(completion.strip()) - len(row.record["answer"]))

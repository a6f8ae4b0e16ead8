"""The sample buffer between the rollout workers and the learner: exactly-once, staleness-checked.

Finished groups wait here, keyed by their request ``uid`` (a duplicate delivery of a uid is
ignored and counted). ``take(n)`` first drops every buffered group the learner may no longer use
(v_l − v_b > η: StalenessController's drop rule, counted there), then returns the n oldest groups
by uid, i.e. in the order their prompts were admitted, which is the order AReaL's admission bound
assumes. Fewer than n fresh groups: nothing is taken and the buffer waits for more. In-order
batches (``algorithm.in_order``) also wait while an older uid is still being generated.
"""
from __future__ import annotations

from typing import Optional

from stabledrl.common.types import Episode
from stabledrl.coordinator.decisions.staleness import StalenessController


class GroupBuffer:
    def __init__(self, staleness: StalenessController) -> None:
        self.staleness = staleness
        self.groups: dict[int, Episode] = {}  # uid -> finished episode with a group
        self.seen: set[int] = set()  # uids ever delivered (exactly-once accounting)
        self.duplicates = 0
        self.empty = 0  # episodes whose every sample was dropped by the reward

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, episode: Episode) -> bool:
        """Accept a finished episode; False for a duplicate uid (ignored) or an empty group."""
        if episode.uid in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(episode.uid)
        if episode.group is None:  # admitted, but it will never reach the learner: free its place
            self.staleness.abort(1)
            self.empty += 1
            return False
        self.staleness.finish(1)
        self.groups[episode.uid] = episode
        return True

    def take(self, n: int, before: Optional[int] = None) -> Optional[list[Episode]]:
        """The n oldest fresh episodes for the learner at ``staleness.version``, or None. With
        ``before`` (the oldest uid still being generated), only a batch of uids all older than it:
        batch b is then exactly the b-th n fresh uids of the stream (in-order batches)."""
        stale = [uid for uid, e in self.groups.items() if not self.staleness.is_fresh(e.group.policy_version)]
        if stale:
            self.staleness.consume([self.groups.pop(uid).group.policy_version for uid in stale])  # dropped, counted
        if len(self.groups) < n:
            return None
        uids = sorted(self.groups)[:n]
        if before is not None and uids[-1] > before:
            return None  # an older prompt is still out: wait for it
        batch = [self.groups.pop(uid) for uid in uids]
        kept = self.staleness.consume([e.group.policy_version for e in batch])
        assert all(kept), "fresh groups were judged stale"
        return batch

    def pending_uids(self) -> list[tuple[int, str]]:
        """(uid, prompt_id) of buffered episodes, for a checkpoint to re-queue."""
        return [(uid, e.prompt_id) for uid, e in sorted(self.groups.items())]

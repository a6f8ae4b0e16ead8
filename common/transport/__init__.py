"""Weight transport between the learner and the rollout workers (runs inside both kinds of actor).

``weights``: the ``WeightPush`` interface, its config, the Ray object-store push and the
coordinator-side ``transfer_weights``; ``broadcast``: the collective (NCCL / gloo) push.
"""
from common.transport.weights import (
    ParameterLoader,
    WeightHandle,
    WeightPush,
    WeightPushConfig,
    setup_weight_push,
    transfer_weights,
)

__all__ = ["ParameterLoader", "WeightHandle", "WeightPush", "WeightPushConfig", "setup_weight_push", "transfer_weights"]

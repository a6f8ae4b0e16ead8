"""The environment for a benchmark rehearsal whose subject is not inductor's kernels: a script that
runs its compiled parts (``sampler.compile``, ``learner.compile``) because the GPU run it rehearses
does, checked only for running and for what it records. Every ``torch.compile`` of its processes
still traces its function (dynamo, then AOT autograd) and runs the traced graph, with torch's
``aot_eager`` backend in place of inductor, so a graph break, a failed trace or a wrong guard still
fails the rehearsal; only inductor's CPU build of the C++ kernels of shapes no other test compiles is
left out, on a machine without inductor's cache (a fresh CI machine).

Inductor's kernels are tested where they are the subject: the compiled exact forward
(tests/unit/rollout/test_sampler_compile.py), the compiled static steps
(tests/unit/rollout/test_sampler_cuda_graph.py), the fused token choice
(tests/unit/rollout/test_sampler_counter_noise.py), the learner's fused norms and activation
(tests/unit/learner/test_learner_fused.py, tests/e2e/test_learner_engine.py's compiled ZeRO-3
steps) and the sampler suite's rehearsal, which compare compiled tokens, gradients and updates with
eager ones. The system and peer suites' rehearsals keep inductor too: their bf16 recipes generate
faster through its kernels than through traced graphs run eagerly, and share the kernels among
themselves through inductor's cache.
"""
from __future__ import annotations

# torch._dynamo.config.debug_backend_override: the backend of every graph (ids from 0 on)
WITHOUT_INDUCTOR = {"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"}

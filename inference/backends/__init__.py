"""Compute backends for the dense part of a prefill chunk: `cpu` (the kernels, always) and `rknpu`
(RK3588's NPU). `EngineConfig.backend` chooses; `select` runs the self-test and says why it fell back."""

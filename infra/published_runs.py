"""Published training runs, each as its authors published it (model, GPUs, sequence length, batch, layout,
precision, throughput and, where given, peak memory) with its source; ``infra.validation`` scores them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from infra.layout import ModelShape
from tasks.model_config import PRESETS, ModelConfig


def _gpt(dim: int, layers: int, heads: int, vocab: int) -> ModelConfig:
    """A GPT block (GELU MLP of width 4h) as the equal-FLOPs SwiGLU (see the module docstring)."""
    return ModelConfig(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=heads, ffn_hidden=8 * round(dim / 3),
                       vocab_size=vocab)


def _mpt(dim: int, layers: int, heads: int) -> ModelConfig:
    """MPT (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): GPT blocks, vocabulary 50,368, tied."""
    return dataclasses.replace(_gpt(dim, layers, heads, 50368), tie_embeddings=True)


LLAMA2_7B = ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11008, vocab_size=32000)
LLAMA2_13B = ModelConfig(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_hidden=13824, vocab_size=32000)
LLAMA2_70B = ModelConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=32000)
MPT = {"1b": _mpt(2048, 24, 16), "3b": _mpt(2560, 32, 20), "7b": _mpt(4096, 32, 32), "13b": _mpt(5120, 40, 40),
       "30b": _mpt(7168, 48, 56), "70b": _mpt(8192, 80, 64)}


@dataclass(frozen=True)
class Run:
    """One published run: its inputs as published and its throughput in the unit the source used."""

    key: str
    stack: str
    source: str  # document and table/figure
    model: str
    cfg: ModelConfig
    gpu: str  # infra.catalogue name
    gpus: int
    seq_len: int
    global_batch: int  # sequences per optimizer step
    layout: str  # infra.layout.parse_layout syntax
    precision: str
    published: float
    unit: str  # tokens/s/GPU | TFLOP/s/GPU
    memory_gib: float | None = None  # published peak memory per GPU
    search: tuple[str, ...] = ()  # unpublished inputs the planner picks: mb, vp, ac
    tp_overlap: bool | None = None  # None: the stack's default
    fp8_all_gather: bool = False  # FSDP all-gathers FP8 weights (torchao enable_fsdp_float8_all_gather)

    @property
    def gelu_mlp(self) -> bool:
        """GPT and MPT blocks (``_gpt``) have a GELU MLP, counted as a SwiGLU of 8h/3 but with its saves."""
        return self.model.startswith(("GPT", "MPT"))
    fits: str | None = None  # the FITTED constant this row determines

    def published_tokens_per_gpu(self) -> float:
        if self.unit == "tokens/s/GPU":
            return self.published
        return self.published * 1e12 / ModelShape(self.cfg, self.seq_len).flops_per_token


LLAMA3 = "Llama 3 paper (Dubey et al. 2024), Table 4"
MEGATRON = "NVIDIA/Megatron-LM README.md, Performance Benchmarking (images/model_table.png, Megatron-Core r0.8.0)"
NEMO_LONG = "NVIDIA/NeMo docs/source/performance/performance_long_sequence.md, LLAMA2-7B (FP8), with-CP columns"
NEMO_2407 = "NVIDIA/NeMo docs/source/performance/performance_summary.md, pre-training table (NeMo 24.07, FP8)"
BRIDGE_2511 = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, 25.11 container, DGX-H100"
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, table "
TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table "
TRAINY = "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md"
ASYNC_TP = "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, "
MEGATRON_SEARCH = ("mb", "vp", "ac")

RUNS: list[Run] = [
    # Meta, Llama 3 405B on H100 80GB (700 W). §3.3.2: FSDP shards optimizer states and gradients but does not
    # reshard parameters after the forward (ZeRO-2); one layer fewer on the first and the last stage, whose
    # outer virtual stages hold only the embedding and the output: 126 layers on 16 × 8 virtual stages.
    Run("llama3-405b-8k", "meta", LLAMA3 + ", row 1", "Llama 3 405B", PRESETS["405b"], "h100", 8192, 8192, 2048,
        "tp=8,pp=16,dp=64,mb=1,vp=8,zero=2,split=balanced,ac=none", "bf16", 430, "TFLOP/s/GPU", fits="meta"),
    Run("llama3-405b-16k", "meta", LLAMA3 + ", row 2", "Llama 3 405B", PRESETS["405b"], "h100", 16384, 8192, 2048,
        "tp=8,pp=16,dp=128,mb=1,vp=8,zero=2,split=balanced,ac=none", "bf16", 400, "TFLOP/s/GPU"),
    Run("llama3-405b-16k-cp16", "meta", LLAMA3 + ", row 3", "Llama 3 405B", PRESETS["405b"], "h100", 16384, 131072,
        128, "tp=8,cp=16,pp=16,dp=8,mb=1,vp=8,zero=2,split=balanced,ac=none", "bf16", 380, "TFLOP/s/GPU",
        fits="attention"),
    # Megatron-LM weak scaling on H100: GPT models, vocabulary 131,072, sequence 4,096, DP 48.
    *[Run(f"megatron-{size}", "megatron", MEGATRON, f"GPT {size}", _gpt(h, n, a, 131072), "h100", gpus, 4096, batch,
          f"tp={tp},pp={pp},dp=48,zero=1", "bf16", tflops, "TFLOP/s/GPU", search=MEGATRON_SEARCH,
          fits="megatron" if size == "177B" else None)
      for size, a, h, n, tp, pp, gpus, batch, tflops in (
          ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
          ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
          ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
          ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
          ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9))],
    # NeMo 24.07 on DGX-H100, FP8 (Transformer Engine).
    Run("nemo-gpt3-175b-128", "nemo", NEMO_2407, "GPT-3 175B", _gpt(12288, 96, 96, 51200), "h100", 128, 2048,
        256, "tp=4,pp=8,vp=6,mb=1,zero=1", "fp8", 716, "tokens/s/GPU", search=("ac",)),
    Run("nemo-gpt3-175b-512", "nemo", NEMO_2407, "GPT-3 175B", _gpt(12288, 96, 96, 51200), "h100", 512, 2048,
        2048, "tp=4,pp=8,vp=6,mb=2,zero=1", "fp8", 825, "tokens/s/GPU", search=("ac",)),
    Run("nemo-llama2-7b-8", "nemo", NEMO_2407, "Llama 2 7B", LLAMA2_7B, "h100", 8, 4096, 128, "tp=1,pp=1,mb=1,zero=1",
        "fp8", 16934, "tokens/s/GPU", search=("ac",)),
    Run("nemo-llama2-13b-16", "nemo", NEMO_2407, "Llama 2 13B", LLAMA2_13B, "h100", 16, 4096, 128,
        "tp=1,pp=4,vp=10,mb=1", "fp8", 8715, "tokens/s/GPU", search=("ac",)),
    Run("nemo-llama2-70b-64", "nemo", NEMO_2407, "Llama 2 70B", LLAMA2_70B, "h100", 64, 4096, 128,
        "tp=4,pp=4,vp=20,mb=1", "fp8", 1728, "tokens/s/GPU", search=("ac",), fits="fp8_te"),
    Run("nemo-llama3-8b-8-cp2", "nemo", NEMO_2407, "Llama 3 8B", PRESETS["8b"], "h100", 8, 8192, 128,
        "tp=1,pp=1,cp=2,mb=1,zero=1", "fp8", 12273, "tokens/s/GPU", search=("ac",)),
    Run("nemo-llama3-70b-64-cp2", "nemo", NEMO_2407, "Llama 3 70B", PRESETS["70b"], "h100", 64, 8192, 128,
        "tp=4,pp=4,cp=2,vp=5,mb=1", "fp8", 1524, "tokens/s/GPU", search=("ac",)),
    # NeMo 24.03.01 on DGX-H100, FP8, Llama 2 7B from 4K to 1M tokens, GPUs growing with the sequence (one per
    # 1K tokens). The global batch is not published: taken as 4M tokens per step, as the same document's B200
    # table publishes it for Llama 3 8B (batch 512 at 8K down to 4 at 1M); the micro-batch is one sequence.
    *[Run(f"nemo-llama2-7b-{k}k-cp{cp}", "nemo-2403", NEMO_LONG, "Llama 2 7B", LLAMA2_7B, "h100", tp * pp * dp * cp,
          k * 1024, 4096 // k, f"tp={tp},pp={pp},cp={cp},mb=1,zero=1", "fp8", tflops, "TFLOP/s/GPU", search=("ac",),
          fits="cudnn_2403" if k == 128 else None)
      for k, tp, pp, dp, cp, tflops in ((4, 1, 1, 4, 1, 768), (8, 1, 2, 4, 1, 730), (16, 2, 1, 8, 1, 660),
                                        (32, 2, 1, 8, 2, 610), (64, 4, 1, 8, 2, 574), (128, 4, 1, 8, 4, 555),
                                        (256, 4, 1, 8, 8, 549), (512, 8, 1, 4, 16, 549), (1024, 8, 1, 4, 32, 536))],
    # Megatron-Bridge 25.11 (NeMo container), FP8 current scaling.
    Run("bridge-llama3-8b-8", "bridge", BRIDGE_2511, "Llama 3 8B", PRESETS["8b"], "h100", 8, 8192, 128,
        "tp=1,pp=1,mb=1,zero=3", "fp8", 14451, "tokens/s/GPU", search=("ac",)),
    Run("bridge-llama3-70b-64", "bridge", BRIDGE_2511, "Llama 3 70B", PRESETS["70b"], "h100", 64, 8192, 128,
        "tp=4,pp=8,vp=5,mb=1", "fp8", 1602, "tokens/s/GPU", search=("ac",)),
    Run("bridge-llama31-405b-1024", "bridge", BRIDGE_2511, "Llama 3.1 405B", PRESETS["405b"], "h100", 1024, 8192,
        512, "tp=8,pp=8,cp=2,vp=8,mb=1,split=balanced", "fp8", 292, "tokens/s/GPU", search=("ac",)),
    # LLM Foundry (MPT), PyTorch FSDP: FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2; "Activation Checkpointing"
    # True = full recomputation.
    *[Run(f"foundry-mpt-{size}-{gpu_name}-{gpus}-{seq}", "llm-foundry", FOUNDRY + table, f"MPT {size}", MPT[size],
          gpu_name, gpus, seq, gbs, f"tp=1,pp=1,mb={mb},zero={zero},ac={'full' if ac else 'none'}", precision, tps,
          "tokens/s/GPU", fits=fit)
      for table, size, gpu_name, gpus, seq, mb, gbs, zero, ac, precision, tps, fit in (
          ("'H100 80GB BF16'", "7b", "h100", 8, 2048, 6, 48, 3, False, "bf16", 10643, "llm-foundry"),
          ("'H100 80GB BF16'", "1b", "h100", 8, 2048, 14, 112, 3, False, "bf16", 45455, None),
          ("'H100 80GB BF16'", "13b", "h100", 64, 2048, 2, 128, 3, False, "bf16", 4800, "fsdp1_layer_ms"),
          ("'H100 80GB BF16'", "7b", "h100", 8, 8192, 8, 128, 3, True, "bf16", 6935, None),
          ("'H100 80GB BF16'", "70b", "h100", 64, 2048, 8, 2048, 3, True, "bf16", 1039, None),
          ("'H100 80GB BF16 (Large Scale, >= 128 GPUs)'", "70b", "h100", 512, 2048, 8, 4096, 3, True, "bf16", 1007,
           None),
          ("'H100 80GB BF16 (Large Scale, >= 128 GPUs)'", "30b", "h100", 128, 2048, 8, 1024, 3, True, "bf16", 2199,
           None),
          ("'H100 80GB BF16 (Large Scale, >= 128 GPUs)'", "3b", "h100", 512, 2048, 8, 4096, 2, False, "bf16", 21664,
           None),
          ("'H100 80GB FP8'", "3b", "h100", 8, 2048, 10, 480, 3, False, "fp8", 30586, None),
          ("'H100 80GB FP8'", "1b", "h100", 8, 8192, 2, 64, 3, False, "fp8", 32010, None),
          ("'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "7b", "a100", 8, 2048, 6, 96, 3, False, "bf16",
           4641, "a100"),
          ("'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "13b", "a100", 8, 2048, 2, 48, 3, False,
           "bf16", 2262, None),
          ("'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "70b", "a100", 64, 2048, 8, 2048, 3, True,
           "bf16", 410, None),
          ("'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'", "7b", "a100-40gb", 128, 2048, 18, 2304, 3, True,
           "bf16", 3623, None),
          ("'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'", "70b", "a100-40gb", 128, 2048, 4, 512, 3, True,
           "bf16", 376, None),
      )],
    # torchtitan on Grand Teton H100s (96 GB, 500 W), Llama 3.1, sequence 8,192, torch.compile on every row here.
    Run("titan-8b-8-bf16", "torchtitan", TITAN + "1 (FSDP + torch.compile)", "Llama 3.1 8B", PRESETS["8b"],
        "h100-96gb-500w", 8, 8192, 16, "tp=1,mb=2,ac=selective", "bf16", 6667, "tokens/s/GPU", memory_gib=77.0,
        fits="h100-96gb-500w"),
    Run("titan-8b-8-fp8", "torchtitan", TITAN + "1 (FSDP + torch.compile + Float8)", "Llama 3.1 8B", PRESETS["8b"],
        "h100-96gb-500w", 8, 8192, 16, "tp=1,mb=2,ac=selective", "fp8", 8532, "tokens/s/GPU", memory_gib=76.8,
        fits="fp8_torchtitan"),
    Run("titan-8b-128-bf16", "torchtitan", TITAN + "3 (FSDP + torch.compile)", "Llama 3.1 8B", PRESETS["8b"],
        "h100-96gb-500w", 128, 8192, 256, "tp=1,mb=2,ac=selective", "bf16", 6514, "tokens/s/GPU", memory_gib=62.0),
    Run("titan-8b-128-fp8", "torchtitan", TITAN + "3 (FSDP + torch.compile + Float8)", "Llama 3.1 8B",
        PRESETS["8b"], "h100-96gb-500w", 128, 8192, 256, "tp=1,mb=2,ac=selective", "fp8", 8380, "tokens/s/GPU",
        memory_gib=61.8),
    *[Run(f"titan-8b-8-cp{cp}", "torchtitan", TITAN + "2 (FSDP + CP + torch.compile + Float8)", "Llama 3.1 8B",
          PRESETS["8b"], "h100-96gb-500w", 8, seq, 8 // cp, f"tp=1,cp={cp},mb=1,ac=full", "fp8", tps, "tokens/s/GPU",
          memory_gib=mem)
      for cp, seq, tps, mem in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2), (4, 131072, 1071, 84.0),
                                (8, 262144, 548, 84.5))],
    Run("titan-70b-256", "torchtitan", TITAN + "4 (2D, torch.compile + Float8)", "Llama 3.1 70B", PRESETS["70b"],
        "h100-96gb-500w", 256, 8192, 512, "tp=8,mb=16,ac=full", "fp8", 829, "tokens/s/GPU", memory_gib=71.9),
    Run("titan-70b-256-asynctp", "torchtitan", TITAN + "4 (2D + AsyncTP)", "Llama 3.1 70B", PRESETS["70b"],
        "h100-96gb-500w", 256, 8192, 512, "tp=8,mb=16,ac=full", "fp8", 876, "tokens/s/GPU", memory_gib=67.6,
        tp_overlap=True, fits="async_tp"),
    # Table 5: local batch 32 cut into pp = 8 micro-batches of 4 (torchtitan's default micro-batch count is the
    # pipeline degree); the interleaved schedule with 2 stages per rank (its default for looped schedules);
    # layers split by torchtitan's generate_split_points (pipelining_utils.py at 9dec370).
    Run("titan-405b-512-1f1b", "torchtitan", TITAN + "5 (3D, 1F1B)", "Llama 3.1 405B", PRESETS["405b"],
        "h100-96gb-500w", 512, 8192, 256, "tp=8,pp=8,mb=4,ac=full,schedule=1F1B,split=torchtitan", "fp8", 100,
        "tokens/s/GPU", memory_gib=82.5, tp_overlap=True),
    Run("titan-405b-512-interleaved", "torchtitan", TITAN + "5 (3D, Interleaved 1F1B)", "Llama 3.1 405B",
        PRESETS["405b"], "h100-96gb-500w", 512, 8192, 256,
        "tp=8,pp=8,mb=4,ac=full,schedule=Interleaved1F1B,vp=2,split=torchtitan", "fp8", 128, "tokens/s/GPU",
        memory_gib=72.7, tp_overlap=True),
    # Table 6: the 405B 3D layout of Table 5 (1F1B, AsyncTP) with context parallel folded out of FSDP; local batch 8
    # in pp = 8 micro-batches of one sequence, so every rank holds 32,768 tokens of a micro-batch at every cp.
    *[Run(f"titan-405b-512-cp{cp}", "torchtitan", TITAN + "6 (4D, FSDP + TP + PP + CP)", "Llama 3.1 405B",
          PRESETS["405b"], "h100-96gb-500w", 512, seq, 8 * (8 // cp),
          f"tp=8,pp=8,cp={cp},mb=1,ac=full,schedule=1F1B,split=torchtitan", "fp8", tps, "tokens/s/GPU",
          memory_gib=mem, tp_overlap=True)
      for cp, seq, tps, mem in ((1, 32768, 76, 75.3), (2, 65536, 47, 75.9), (4, 131072, 31, 77.1),
                                (8, 262144, 16, 84.9))],
    Run("titan-h200-8b-32", "torchtitan-2506", TRAINY, "Llama 3.1 8B", PRESETS["8b"], "h200", 32, 8192, 64,
        "tp=1,mb=2,ac=selective", "fp8", 10938, "tokens/s/GPU", memory_gib=47.96, fits="torchtitan",
        fp8_all_gather=True),
    Run("titan-h200-8b-64", "torchtitan-2506", TRAINY, "Llama 3.1 8B", PRESETS["8b"], "h200", 64, 8192, 128,
        "tp=1,mb=2,ac=selective", "fp8", 10753, "tokens/s/GPU", memory_gib=46.97, fp8_all_gather=True),
    # June 2025, vanilla and async TP on Grand Teton (torch.compile; FSDP × TP8, the local batch one micro-batch).
    # Its float8 rowwise rows are left out: the planner has no rowwise recipe (tensorwise scales only), and the
    # source calls their vanilla-TP baseline a known slowdown (pytorch/torchtitan#1207).
    *[Run(f"titan-2506-{model}-{gpus}-{precision}{'-asynctp' if asynctp else ''}", "torchtitan-2506",
          ASYNC_TP + f"Llama3 {model} table ({'async' if asynctp else 'vanilla'} TP, {precision})",
          f"Llama 3.1 {model.upper()}", PRESETS[model], "h100-96gb-500w", gpus, 8192, batch, layout, precision, tps,
          "tokens/s/GPU", tp_overlap=asynctp)
      for model, gpus, batch, layout, rows in (
          ("70b", 256, 16 * 32, "tp=8,mb=16,ac=full", (("bf16", 597.3, 652.4), ("fp8", 809.8, 942.4))),
          ("8b", 64, 12 * 8, "tp=8,mb=12,ac=selective", (("bf16", 4378, 4809.4), ("fp8", 5078.1, 5570.1))))
      for precision, vanilla, asynced in rows
      for asynctp, tps in ((False, vanilla), (True, asynced))],
]

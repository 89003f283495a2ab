"""The Llama-3-style decoder: shapes, parameter counts, causality, GQA, RoPE, layout-free init."""

from __future__ import annotations

import pytest
import torch

from tasks.llama import Transformer, apply_rope, canonical_name, rope_tables
from tasks.model_config import PRESETS, preset

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tasks/train/conftest.py

# Meta's published parameter counts (model cards: Llama 3.2 1B and 3B, Llama 3.1 8B and 70B).
PUBLISHED = {"1b": 1.23e9, "3b": 3.21e9, "8b": 8.03e9, "70b": 70.6e9}


def small(**overrides) -> Transformer:
    shape = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48)
    cfg = preset("tiny", **{**shape, **overrides})
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_llama3_parameter_counts(name):
    assert PRESETS[name].num_params() == pytest.approx(PUBLISHED[name], rel=0.005)


@pytest.mark.parametrize("tie", [False, True])
def test_built_model_has_exactly_the_configured_parameter_count(tie):
    model = small(tie_embeddings=tie)
    assert sum(p.numel() for p in model.parameters()) == model.cfg.num_params()


def test_large_presets_build_on_meta_without_memory():
    with torch.device("meta"):
        model = Transformer(PRESETS["8b"])
    assert sum(p.numel() for p in model.parameters()) == PRESETS["8b"].num_params()
    assert all(p.is_meta for p in model.parameters())


def test_forward_returns_logits_per_position():
    model = small()
    tokens = torch.randint(0, 97, (3, 11))
    assert model(tokens).shape == (3, 11, 97)


def test_future_tokens_do_not_change_earlier_logits():
    model = small()
    tokens = torch.randint(0, 97, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 97
    torch.testing.assert_close(model(tokens)[:, :8], model(changed)[:, :8])
    assert not torch.allclose(model(tokens)[:, 8:], model(changed)[:, 8:])


def test_grouped_query_attention_equals_attention_with_repeated_kv_heads():
    grouped = small()  # 4 query heads share 2 key/value heads
    full = small(n_kv_heads=4)
    state = grouped.state_dict()
    for i in range(2):
        for name in ("wk", "wv"):
            key = f"layers.{i}.attention.{name}.weight"
            heads = state[key].view(2, 8, 32)  # (K, E, D)
            state[key] = heads.repeat_interleave(2, dim=0).reshape(32, 32)  # query head h uses kv head h // 2
    full.load_state_dict(state)
    tokens = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(full(tokens), grouped(tokens))


def test_rope_scores_depend_only_on_relative_position():
    rope = rope_tables(head_dim=8, max_seq_len=16, theta=10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(m: int, n: int) -> torch.Tensor:
        qs = apply_rope(q.expand(1, 16, 1, 8), rope)[0, m, 0]
        ks = apply_rope(k.expand(1, 16, 1, 8), rope)[0, n, 0]
        return qs @ ks

    torch.testing.assert_close(score(5, 2), score(13, 10))
    torch.testing.assert_close(apply_rope(q.expand(1, 16, 1, 8), rope).norm(dim=-1), q.norm().expand(1, 16, 1))


def test_interleaved_rope_is_half_split_rope_after_the_exports_q_k_row_permutation():
    """Layout parity without transformers: rotating interleaved pairs (smelt) equals rotating
    half-split pairs (x[i], x[i + E/2]: transformers, vLLM) of queries made with the export's
    permuted wq rows (tasks/train/hf.py), up to that same permutation of the output."""
    from tasks.train.hf import from_hf, to_hf

    E, heads, D, T = 8, 3, 12, 10
    rope = rope_tables(head_dim=E, max_seq_len=T, theta=10000.0)
    w, x = torch.randn(heads * E, D), torch.randn(1, T, D)
    hf_name, w_hf = to_hf("layers.0.attention.wq.weight", w, E)
    assert hf_name == "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(from_hf(hf_name, w_hf, E)[1], w)

    smelt = apply_rope((x @ w.T).view(1, T, heads, E), rope)
    q = (x @ w_hf.T).view(1, T, heads, E)
    cos = torch.cat([rope[:, :, 0]] * 2, -1)[None, :, None]  # (1, T, 1, E): freqs repeated, half-split
    sin = torch.cat([rope[:, :, 1]] * 2, -1)[None, :, None]
    rotate_half = torch.cat([-q[..., E // 2:], q[..., : E // 2]], -1)
    half_split = q * cos + rotate_half * sin
    interleave = torch.stack([half_split[..., : E // 2], half_split[..., E // 2:]], -1).flatten(-2)
    torch.testing.assert_close(interleave, smelt)
    assert not torch.allclose(half_split, smelt, atol=1e-2)  # the layouts really differ


def test_tied_embeddings_share_one_tensor():
    model = small(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight


def test_a_pipeline_stage_starts_from_the_same_weights_as_the_whole_model():
    whole = small()
    with torch.device("meta"):
        stage = Transformer(whole.cfg)
    del stage.layers["0"]
    stage.tok_embeddings = None
    stage.to_empty(device="cpu")
    stage.init_weights(seed=0)
    for name, param in stage.named_parameters():
        assert torch.equal(param, whole.get_parameter(name)), name
    assert not torch.equal(whole.layers["0"].attention.wq.weight, whole.layers["1"].attention.wq.weight)


def test_another_seed_gives_other_weights():
    reseeded = small()
    reseeded.init_weights(seed=1)
    assert not torch.equal(reseeded.output.weight, small().output.weight)


def test_residual_projections_start_smaller_with_depth_and_norms_start_at_one():
    model = small()
    assert model.init_std("layers.0.attention.wo.weight") == pytest.approx(0.02 / 2)
    assert model.init_std("layers.0._checkpoint_wrapped_module.feed_forward.w2.weight") == pytest.approx(0.01)
    assert torch.equal(model.norm.weight, torch.ones(32))


def test_canonical_name_removes_wrapper_prefixes():
    assert canonical_name("layers.3._checkpoint_wrapped_module._orig_mod.attention.wq.weight") == "layers.3.attention.wq.weight"


def test_missing_vocab_size_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab_size must be set"):
        Transformer(preset("tiny"))


def _plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm as autograd would run it, for reference."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def test_rms_norm_gradients_are_exact_in_float64():
    from tasks.llama import _RMSNorm
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNorm.apply(a, b, 1e-5), (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_autograd_of_the_plain_expression(dtype):
    from tasks.llama import RMSNorm
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 7, 64, dtype=dtype, requires_grad=True)
    grad = torch.randn(3, 7, 64, dtype=dtype)
    out = norm(x)
    ref_x = x.detach().clone().requires_grad_(True)
    ref_w = norm.weight.detach().clone().requires_grad_(True)
    ref = _plain_rms_norm(ref_x, ref_w, 1e-5)
    assert torch.equal(out, ref)  # the forward is the same arithmetic
    out.backward(grad)
    ref.backward(grad)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(x.grad, ref_x.grad, **tol)
    torch.testing.assert_close(norm.weight.grad, ref_w.grad, **tol)


def test_rms_norm_keeps_its_input_and_one_scale_per_row_not_fp32_copies():
    from tasks.llama import RMSNorm
    norm = RMSNorm(64, 1e-5).to(torch.bfloat16)
    x = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norm(x)
    assert sorted((str(t.dtype), tuple(t.shape)) for t in saved) == [
        ("torch.bfloat16", (4, 8, 64)), ("torch.bfloat16", (64,)), ("torch.float32", (4, 8, 1))]

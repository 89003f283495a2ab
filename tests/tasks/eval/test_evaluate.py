"""Scoring held-out tokens: a model that knows nothing scores exactly ln(V) per token."""

import math

import torch

from tasks.eval.evaluate import score
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.token_shards import TokenStream
from tests.tasks.train.token_corpus import make_corpus


def test_a_model_with_zero_output_weights_scores_log_vocab_per_token(tmp_path):
    url = make_corpus(f"file://{tmp_path}/tokens", tokens=5_000, vocab=256)
    model = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=256,
                                    max_seq_len=64))
    model.init_weights(seed=0)
    with torch.no_grad():
        model.output.weight.zero_()
    stream = TokenStream(url, "train", 32, cache_dir=None)
    result = score(model.eval(), stream, seq_len=32, batch_size=4, max_tokens=1_000)
    assert result["tokens"] == result["windows"] * 32 and result["windows"] == 1_000 // 32
    assert math.isclose(result["nll_sum"] / result["tokens"], math.log(256), rel_tol=1e-5)

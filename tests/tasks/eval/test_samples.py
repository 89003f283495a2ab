"""Samples: prompts are the held-out documents' own beginnings; greedy and seeded sampled continuations."""

import torch

from tasks.eval import samples
from tasks.eval.config import SamplesConfig
from tasks.eval.samples import complete, continue_rows, document_beginnings, validation_samples
from tasks.token_shards import TokenStream
from tests.tasks.eval.known_text import DOCS, known_tokens, small_model


def test_prompts_are_the_beginnings_of_the_first_documents_long_enough(tmp_path, monkeypatch):
    docs = ["too short.", DOCS[0], "short again.", DOCS[1], DOCS[2]]
    url = f"file://{tmp_path}/tokens"
    tokenizer, stream = known_tokens(url, docs)
    monkeypatch.setattr(samples, "SCAN_CHUNK", 7)  # documents and EOS cross chunk boundaries
    tokens = TokenStream(url, "val", 8, cache_dir=None)
    eos = tokenizer.token_to_id("<|eos|>")
    found = document_beginnings(tokens, eos, docs=2, min_tokens=20)
    assert [tokenizer.decode(ids.tolist()) for ids in found] == [
        tokenizer.decode(tokenizer.encode(doc).ids[:20]) for doc in (DOCS[0], DOCS[1])]
    assert len(document_beginnings(tokens, eos, docs=9, min_tokens=20)) == 3  # only three are long enough


def test_each_sample_shows_prompt_greedy_seeded_sample_and_the_real_continuation(tmp_path):
    url = f"file://{tmp_path}/tokens"
    tokenizer, _ = known_tokens(url)
    model = small_model(tokenizer.get_vocab_size())
    tokens = TokenStream(url, "val", 32, cache_dir=None)
    cfg = SamplesConfig(docs=2, prompt_tokens=12, new_tokens=6, temperature=1.0, seed=7)
    first = validation_samples(model, tokenizer, tokens, cfg, seq_len=32)
    assert len(first) == 2
    for sample, doc in zip(first, DOCS):
        ids = tokenizer.encode(doc).ids
        assert sample["prompt"] == tokenizer.decode(ids[:12]) and sample["actual"] == tokenizer.decode(ids[12:18])
        assert sample["greedy"] == tokenizer.decode(complete(model, ids[:12], 6, context=32))
    assert validation_samples(model, tokenizer, tokens, cfg, seq_len=32) == first  # the seed fixes the sample
    other_seeds = [validation_samples(model, tokenizer, tokens, SamplesConfig(docs=1, prompt_tokens=12, new_tokens=6,
                                                                              temperature=1.0, seed=s), 32)[0]["sampled"]
                   for s in range(2)]
    assert len({first[0]["sampled"], *other_seeds}) > 1  # ... and it is a sample, not the greedy path


def test_a_row_ends_after_the_stop_token_and_batching_leaves_the_greedy_row_alone(tmp_path):
    tokenizer, stream = known_tokens(f"file://{tmp_path}/tokens")
    model = small_model(tokenizer.get_vocab_size(), seed=1)
    prompt = stream[:10].tolist()
    greedy = complete(model, prompt, 6)
    assert len(greedy) == 6
    assert continue_rows(model, prompt, 6, [0.0], stop_id=greedy[0]) == [greedy[:1]]
    beside_a_sample = continue_rows(model, prompt, 6, [0.0, 1.0], generator=torch.Generator().manual_seed(0))
    assert beside_a_sample[0] == greedy and len(beside_a_sample[1]) == 6

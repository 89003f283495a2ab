"""The token loader: exact windows, one pass per epoch, elastic resume, mixtures, caching, prefetch."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks import contract, storage, verified_reads
from tasks.token_shards import TokenStream
from tasks.train.data import TokenLoader, _chain, _route, permute

VOCAB = 65536


def write_tokens_dataset(url: str, shards: list[np.ndarray], fp: str, split: str = "train") -> str:
    """A tokens dataset (tasks/contract.py record format) whose ``split`` stream is ``shards`` in order."""
    infos = []
    for i, tokens in enumerate(shards):
        tokens = np.asarray(tokens, dtype="<u2")

        def write(f, tokens=tokens):
            f.write(tokens.tobytes())
            return len(tokens)

        infos.append(contract.write_shard(url, f"{split}-{i:05d}.bin", write, split=split,
                                          tokens=len(tokens), docs=1, dtype="uint16"))
        index = io.BytesIO()
        np.save(index, np.array([0], dtype=np.int64))
        infos.append(contract.write_shard(url, f"{split}-{i:05d}.idx", lambda f, b=index.getvalue(): f.write(b) and 1,
                                          split=split, tokens=0, docs=1, dtype="int64"))
    meta = {"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 0, "bos_id": 1, "pad_id": 2}
    bins = [s for s in infos if s.name.endswith(".bin")]
    contract.commit(url, "tokens", fp, infos, {"tokens": sum(s.rows for s in bins)}, meta=meta)
    return url


@pytest.fixture(scope="module")
def counting(tmp_path_factory) -> str:
    """1,001 tokens 0..1000 over three shards: with seq_len 10 that is 100 samples, token = position."""
    root = tmp_path_factory.mktemp("counting")
    stream = np.arange(1001)
    return write_tokens_dataset(str(root), [stream[:333], stream[333:700], stream[700:]], fp="counting")


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> dict[str, str]:
    """Two datasets told apart by value: ``web`` tokens are < 30000, ``code`` tokens are >= 30000."""
    root = tmp_path_factory.mktemp("mixture")
    return {
        "web": write_tokens_dataset(str(root / "web"), [np.arange(801)], fp="web"),
        "code": write_tokens_dataset(str(root / "code"), [30000 + np.arange(401)], fp="code"),
    }


def loader(urls, weights=None, *, seq_len=10, global_batch=4, dp_rank=0, dp_size=1, seed=0, prefetch=0, **kw):
    if isinstance(urls, str):
        urls = {"only": urls}
    return TokenLoader(urls, weights, split="train", seq_len=seq_len, global_batch=global_batch,
                       dp_rank=dp_rank, dp_size=dp_size, seed=seed, prefetch=prefetch, **kw)


def global_batches(urls, steps, dp_size, state=None, **kw) -> tuple[list[torch.Tensor], dict]:
    """Run ``dp_size`` ranks for ``steps`` steps (from ``state``); each step's ranks concatenated."""
    ranks = [loader(urls, dp_rank=r, dp_size=dp_size, **kw) for r in range(dp_size)]
    if state is not None:
        for r in ranks:
            r.load_state_dict(state)
    out = [torch.cat([r.next_batch()[0] for r in ranks]) for _ in range(steps)]
    state = ranks[0].state_dict()
    for r in ranks:
        r.close()
    return out, state


# ---------------------------------------------------------------------------------------------
# pure order functions


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), key=st.integers(0, 2**64 - 1))
def test_permute_is_a_bijection_of_range_n(n, key):
    out = permute(np.arange(n), n, key)
    assert sorted(out.tolist()) == list(range(n))


def test_permute_depends_on_key_and_is_repeatable():
    a, b = permute(np.arange(1000), 1000, 1), permute(np.arange(1000), 1000, 2)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, permute(np.arange(1000), 1000, 1))
    assert np.array_equal(permute(np.arange(500, 1000), 1000, 1), a[500:])


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=5), seed=st.integers(0, 1000),
       start=st.integers(0, 10**11), count=st.integers(1, 3000))
def test_mixture_shares_match_the_weights_at_every_prefix(weights, seed, start, count):
    chain = _chain(weights, seed)
    which, draw = _route(np.arange(start, start + count), chain)
    head, head_draw = _route(np.arange(start), chain) if start <= 3000 else (None, None)
    total = sum(weights)
    for k, w in enumerate(weights):
        taken = int((which == k).sum())
        # within one sample per node of the exact share: far inside binomial sampling error
        assert abs(taken - count * w / total) <= len(weights) + 1
        # draws of a dataset are consecutive: the i-th sample routed to k is its next draw
        d = draw[which == k]
        if len(d):
            assert np.array_equal(d, d[0] + np.arange(len(d)))
            if head is not None:
                assert d[0] == (head == k).sum()


# ---------------------------------------------------------------------------------------------
# windows, epochs, elasticity


def test_batch_is_windows_of_seq_len_plus_one_shifted_into_targets(counting):
    with loader(counting, global_batch=4) as data:
        inputs, targets = data.next_batch()
    assert inputs.shape == targets.shape == (4, 10) and inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    starts = inputs[:, 0]
    assert torch.equal(starts % 10, torch.zeros(4, dtype=torch.int64))  # window s starts at s * seq_len
    assert torch.equal(inputs, starts[:, None] + torch.arange(10))  # tokens = positions, across shards
    assert torch.equal(targets[:, -1], starts + 10)


def test_a_stream_reads_any_span_across_shards_and_refuses_past_its_end(counting):
    stream = TokenStream(counting, "train", 10, cache_dir=None)
    out = np.empty(500, dtype=np.int64)
    stream.read(300, 500, out)  # spans all three shards
    assert out.tolist() == list(range(300, 800)) and stream.samples == 100 and stream.total == 1001
    with pytest.raises(IndexError, match="outside the stream"):
        stream.read(900, 200, np.empty(200, dtype=np.int64))
    stream.close()


def test_tokens_per_step_and_samples_consumed_count_global_work(counting):
    with loader(counting, global_batch=8, dp_rank=1, dp_size=2) as data:
        assert data.next_batch()[0].shape == (4, 10)
        data.next_batch()
        assert data.samples_consumed == 16 and data.tokens_per_step == 80


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), global_batch=st.sampled_from([1, 4, 5, 8, 25, 40]))
def test_each_epoch_shows_every_sample_once(counting, seed, global_batch):
    steps = 200 // global_batch  # two epochs of 100 samples
    batches, _ = global_batches(counting, steps, 1, global_batch=global_batch, seed=seed)
    starts = (torch.cat(batches)[:, 0] // 10).tolist()
    assert sorted(starts[:100]) == list(range(100))
    assert sorted(starts[100:]) == list(range(100))
    assert starts[:100] != starts[100:]  # a new permutation per epoch


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d1=st.sampled_from([1, 2, 3, 6]), d2=st.sampled_from([1, 2, 3, 6]), k=st.integers(0, 20),
       seed=st.integers(0, 100))
def test_switching_world_size_after_k_steps_sees_the_same_global_batches(counting, d1, d2, k, seed):
    reference, _ = global_batches(counting, k + 4, 1, global_batch=6, seed=seed)
    before, state = global_batches(counting, k, d1, global_batch=6, seed=seed)
    after, _ = global_batches(counting, 4, d2, state=state, global_batch=6, seed=seed)
    assert state["samples_consumed"] == 6 * k
    assert all(torch.equal(a, b) for a, b in zip(before + after, reference))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d1=st.sampled_from([1, 2, 4]), d2=st.sampled_from([1, 2, 4]), k=st.integers(0, 30))
def test_switching_world_size_keeps_a_mixture_on_the_same_global_batches(mixture, d1, d2, k):
    weights = {"web": 0.7, "code": 0.3}
    reference, _ = global_batches(mixture, k + 3, 1, weights=weights, global_batch=4)
    before, state = global_batches(mixture, k, d1, weights=weights, global_batch=4)
    after, _ = global_batches(mixture, 3, d2, state=state, weights=weights, global_batch=4)
    assert all(torch.equal(a, b) for a, b in zip(before + after, reference))


def test_ranks_take_contiguous_slices_of_the_global_batch(counting):
    (whole,), _ = global_batches(counting, 1, 1, global_batch=6, seed=3)
    with loader(counting, global_batch=6, dp_rank=2, dp_size=3, seed=3) as data:
        assert torch.equal(data.next_batch()[0], whole[4:6])


def test_different_seeds_give_different_orders(counting):
    a, _ = global_batches(counting, 3, 1, seed=1)
    b, _ = global_batches(counting, 3, 1, seed=2)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------
# mixtures


def test_mixture_draws_each_dataset_by_weight_and_each_epoch_fully(mixture):
    # web: 80 samples, code: 40; weights 0.75 / 0.25 over 160 samples -> 120 web (1.5 epochs), 40 code (1)
    batches, _ = global_batches(mixture, 40, 2, weights={"web": 0.75, "code": 0.25}, global_batch=4, seed=5)
    starts = torch.cat(batches)[:, 0].tolist()
    web = [s // 10 for s in starts if s < 30000]
    code = [(s - 30000) // 10 for s in starts if s >= 30000]
    assert abs(len(web) - 120) <= 2 and len(web) + len(code) == 160
    assert sorted(web[:80]) == list(range(80)) and sorted(code[:40]) == list(range(40))


def test_mixture_without_weights_mixes_by_size(mixture):
    batches, _ = global_batches(mixture, 30, 1, global_batch=4)
    code = sum(int((b[:, 0] >= 30000).sum()) for b in batches)
    assert abs(code - 40) <= 2  # 40 of 120 samples are code


def test_mixture_of_different_tokenizers_is_refused(mixture, tmp_path):
    other = write_tokens_dataset(str(tmp_path / "o"), [np.arange(100)], fp="o")
    manifest = contract.read_manifest(other)
    manifest.meta["vocab_size"] = 1000
    (tmp_path / "o" / "manifest.json").write_text(manifest.to_json())
    with pytest.raises(ValueError, match="different tokenizer"):
        loader({"web": mixture["web"], "other": other})


def test_weights_must_name_the_datasets(mixture):
    with pytest.raises(ValueError, match="same names"):
        loader(mixture, {"web": 1.0})
    with pytest.raises(ValueError, match="positive"):
        loader(mixture, {"web": 1.0, "code": 0.0})


# ---------------------------------------------------------------------------------------------
# state, errors, caching, prefetch


@pytest.mark.parametrize("change, key", [
    (dict(seq_len=8), "seq_len"), (dict(global_batch=8), "global_batch"), (dict(seed=9), "seed"),
])
def test_resume_refuses_a_changed_contract_and_names_it(counting, change, key):
    with loader(counting) as data:
        data.next_batch()
        state = data.state_dict()
    with loader(counting, **change) as other, pytest.raises(ValueError, match=f"{key} changed"):
        other.load_state_dict(state)


def test_resume_refuses_changed_datasets_or_weights(mixture, counting):
    with loader(mixture, {"web": 1.0, "code": 1.0}) as data:
        state = data.state_dict()
    with loader(mixture, {"web": 2.0, "code": 1.0}) as other, pytest.raises(ValueError, match="weights changed"):
        other.load_state_dict(state)
    with loader({"web": counting, "code": mixture["code"]}, {"web": 1.0, "code": 1.0}) as other:
        with pytest.raises(ValueError, match="datasets changed"):
            other.load_state_dict(state)


def test_bad_batch_split_and_short_data_are_clear_errors(counting, tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        loader(counting, global_batch=6, dp_size=4)
    short = write_tokens_dataset(str(tmp_path / "s"), [np.arange(5)], fp="s")
    with pytest.raises(ValueError, match="fewer than one sample"):
        loader(short)
    with pytest.raises(contract.DatasetError, match="no dataset"):
        loader(str(tmp_path / "missing"))


def test_remote_shards_are_cached_locally_and_read_the_same(counting, tmp_path):
    remote = "memory://loader-test/counting"
    manifest = contract.open_dataset(counting)
    for shard in manifest.shards:
        data = storage.filesystem(contract.shard_url(manifest, shard))[0].cat_file(
            storage.filesystem(contract.shard_url(manifest, shard))[1])
        contract.write_shard(remote, shard.name, lambda f, data=data: f.write(data))
    contract.commit(remote, "tokens", manifest.fingerprint, manifest.shards, manifest.stats, meta=manifest.meta)
    local, _ = global_batches(counting, 5, 1, seed=4)
    cached, _ = global_batches({"only": remote}, 5, 1, seed=4, cache_dir=str(tmp_path / "cache"))
    assert all(torch.equal(a, b) for a, b in zip(local, cached))
    assert sorted(p.name for p in (tmp_path / "cache" / "counting").iterdir()) == [
        "train-00000.bin", "train-00001.bin", "train-00002.bin"]


def test_a_corrupt_remote_shard_is_refused(counting, tmp_path):
    remote = "memory://loader-test/corrupt"
    manifest = contract.open_dataset(counting)
    original = manifest.shards[0]  # 333 tokens: 666 bytes, here overwritten with zeros of the same size
    contract.write_shard(remote, original.name, lambda f: f.write(b"\x00" * original.bytes) // 2)
    contract.commit(remote, "tokens", "corrupt", [original], {}, meta=manifest.meta)
    data = loader({"only": remote}, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(contract.DatasetError, match="shard train-00000.bin of memory://loader-test/corrupt does not match"):
        data.next_batch()
    assert list((tmp_path / "cache" / "corrupt").iterdir()) == []


def test_a_corrupt_local_shard_is_refused_when_first_read(tmp_path):
    url = write_tokens_dataset(str(tmp_path / "d"), [np.arange(101), np.arange(101)], fp="flip")
    path = tmp_path / "d" / "train-00001.bin"
    blob = bytearray(path.read_bytes())
    blob[10] ^= 0x01  # one flipped bit: same size, so only the checksum can tell
    path.write_bytes(bytes(blob))
    data = loader(url, seq_len=10, global_batch=20)
    with pytest.raises(contract.DatasetError, match="shard train-00001.bin .* does not match its manifest checksum"):
        data.next_batch()


def test_a_corrupt_cached_copy_is_fetched_again(counting, tmp_path):
    remote = "memory://loader-test/recache"
    manifest = contract.open_dataset(counting)
    for shard in manifest.shards:
        contract.write_shard(remote, shard.name, lambda f, b=verified_reads.read_shard(manifest, shard): f.write(b))
    contract.commit(remote, "tokens", "recache", manifest.shards, manifest.stats, meta=manifest.meta)
    cache = tmp_path / "cache"
    first, _ = global_batches({"only": remote}, 5, 1, seed=4, cache_dir=str(cache))
    copy = cache / "recache" / "train-00000.bin"
    copy.write_bytes(b"\xff" * copy.stat().st_size)  # the cached copy overwritten in place
    again, _ = global_batches({"only": remote}, 5, 1, seed=4, cache_dir=str(cache))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert copy.read_bytes() == verified_reads.read_shard(manifest, "train-00000.bin")


def test_prefetch_gives_the_same_batches_restarts_on_resume_and_stops_on_close(counting):
    plain, _ = global_batches(counting, 6, 1, seed=7)
    data = loader(counting, seed=7, prefetch=3)
    first = [data.next_batch()[0] for _ in range(4)]
    thread = data._thread
    assert thread.is_alive()
    data.load_state_dict({**data.state_dict(), "samples_consumed": 4})  # back to step 1
    assert not thread.is_alive()
    again = [data.next_batch()[0] for _ in range(5)]
    data.close()
    assert not any(t.name.startswith("token-prefetch") for t in threading.enumerate())
    assert all(torch.equal(a, b) for a, b in zip(first + again, plain[:4] + plain[1:6]))
    with pytest.raises(RuntimeError, match="closed"):
        data.next_batch()


def test_a_read_error_in_the_prefetch_thread_surfaces_in_next_batch(tmp_path):
    url = write_tokens_dataset(str(tmp_path / "gone"), [np.arange(200)], fp="gone")
    data = loader(url, prefetch=2)
    (tmp_path / "gone" / "train-00000.bin").unlink()  # shards are mapped on first read
    with pytest.raises(contract.DatasetError, match="train-00000.bin .* is missing"):
        data.next_batch()
    data.close()


def test_one_dataset_without_weights_has_weight_one(counting):
    with loader(counting) as data:
        assert data.state_dict() == {"samples_consumed": 0, "datasets": {"only": "counting"}, "weights": {"only": 1.0},
                                     "split": "train", "seq_len": 10, "global_batch": 4, "seed": 0}

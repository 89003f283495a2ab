"""Compression baselines: known figures for a known text, and computed over exactly the bytes the model scored."""

import lzma
import math
import shutil
import subprocess
import zlib

import pytest

from tasks.eval.baselines import below, compressed_bits_per_byte
from tasks.eval.config import EvalConfig, SamplesConfig
from tasks.eval.evaluate import score_split
from tests.tasks.eval.known_text import DOCS, known_tokens, small_model

FOX = b"the quick brown fox jumps over the lazy dog. " * 100  # 4,500 bytes


def test_a_known_text_gives_known_xz_zstd_and_zlib_figures():
    figures = compressed_bits_per_byte(FOX)
    # xz -9e writes 136 bytes for this text, zstd -19 68 (content size and checksum), zlib -9 80
    assert figures == {"xz": 8 * 136 / 4500, "zstd": 8 * 68 / 4500, "zlib": 8 * 80 / 4500}
    assert compressed_bits_per_byte(b"") == {"xz": 0.0, "zstd": 0.0, "zlib": 0.0}
    assert math.isclose(below(1.5, 2.0), 0.25) and below(2.2, 2.0) < 0


@pytest.mark.parametrize("tool,args,key", [("xz", ["-9e", "-c"], "xz"), ("zstd", ["-19", "-q", "-c"], "zstd")])
def test_each_figure_is_what_the_command_line_tool_writes_for_the_same_file(tmp_path, tool, args, key):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    text = bytes(range(256)) * 3 + FOX  # not only ASCII
    (tmp_path / "text").write_bytes(text)
    written = subprocess.run([tool, *args, str(tmp_path / "text")], capture_output=True, check=True, timeout=60).stdout
    assert compressed_bits_per_byte(text)[key] == 8 * len(written) / len(text)


def test_the_baselines_are_computed_over_exactly_the_bytes_the_model_scored(tmp_path):
    url = f"file://{tmp_path}/tokens"
    tokenizer, stream = known_tokens(url)
    seq_len = 16
    model = small_model(tokenizer.get_vocab_size())
    result = score_split(model, url, tokenizer, seq_len, EvalConfig(batch_size=4, samples=SamplesConfig(docs=0)))

    # Consecutive windows: token 0 is context only, tokens 1 … windows · seq_len are the targets.
    scored = result["tokens_scored"]
    assert scored == (len(stream) - 1) // seq_len * seq_len < len(stream) - 1  # a tail is left unscored
    text = "".join(DOCS).encode()
    head = tokenizer.decode([int(stream[0])]).encode()
    tail = tokenizer.decode(stream[scored + 1:].tolist()).encode()
    expected = text[len(head):len(text) - len(tail)]
    assert text.startswith(head) and text.endswith(tail) and len(head) > 0 and len(tail) > 0
    assert result["bytes_scored"] == len(expected)
    assert result["baselines"] == {
        "xz": 8 * len(lzma.compress(expected, preset=9 | lzma.PRESET_EXTREME)) / len(expected),
        "zstd": compressed_bits_per_byte(expected)["zstd"],
        "zlib": 8 * len(zlib.compress(expected, 9)) / len(expected),
    }
    # ... and the model's bits per byte has the same bytes under it
    nats = result["val_loss"] * scored
    assert math.isclose(result["bits_per_byte"], nats / (math.log(2) * len(expected)), rel_tol=1e-9)

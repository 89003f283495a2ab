import pyarrow as pa
import pytest

from tasks.dedup.normalize import Words, normalize_text, normalized_words, spaced_bytes


def test_case_punctuation_and_whitespace_do_not_matter():
    assert normalize_text("Hello,  WORLD!\n\tIt's  me...") == "hello world it s me"


def test_nfkc_folds_compatibility_forms():
    assert normalize_text("ＦＵＬＬ ｗｉｄｔｈ ﬁne") == "full width fine"


def test_letters_and_digits_of_every_script_are_kept_and_underscores_split_words():
    assert normalized_words("Größe 42 δοκιμή snake_case") == ["größe", "42", "δοκιμή", "snake", "case"]


def test_text_of_only_punctuation_normalises_to_nothing():
    assert normalized_words(" ... !!! --- ") == []


def test_combining_marks_stay_inside_their_word():
    assert normalized_words("हिन्दी भाषा।") == ["हिन्दी", "भाषा"]


def test_the_byte_path_gives_the_same_words_and_normalised_text_as_the_unicode_path():
    every_ascii = "".join(chr(c) for c in range(128)) * 2
    texts = [every_ascii, "Hello,  WORLD!\n\tIt's  me...", "a\x1cb\x1fc_d", "Größe 42 snake_case", "", " ... ", "one"]
    words = Words.of([spaced_bytes(t) for t in texts])
    assert words.normalized() == [normalize_text(t).encode("utf-8") for t in texts]
    for d, text in enumerate(texts):
        mine = range(words.first[d], words.first[d] + words.counts[d])
        assert [words.blob[words.starts[k] : words.ends[k]].tobytes().decode() for k in mine] == normalized_words(text)


@pytest.mark.parametrize("kind", ["string", "large_string", "sliced", "with_null"])
def test_words_of_an_arrow_batch_are_the_words_of_each_text(kind):
    texts = ["Hello,  WORLD!", "Größe δοκιμή", "end", "start here", "", "ＦＵＬＬ ｗｉｄｔｈ", "a\x1cb", "tail"]
    array = pa.array(texts, type=pa.large_string() if kind == "large_string" else pa.string())
    if kind == "sliced":  # a batch that is a slice of a larger array: its offsets do not start at 0
        array = pa.array(["skipped", *texts]).slice(1)
    if kind == "with_null":
        array, texts = pa.array([*texts, None]), [*texts, ""]
    words = Words.of_arrow(array)
    assert words.normalized() == [normalize_text(t).encode("utf-8") for t in texts]
    for d, text in enumerate(texts):  # "end" and "start" are adjacent in the buffer, yet two documents
        mine = range(words.first[d], words.first[d] + words.counts[d])
        assert [words.blob[words.starts[k] : words.ends[k]].tobytes().decode() for k in mine] == normalized_words(text)

import pickle

import pytest

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.config import C4Config, FineWebConfig, GopherQualityConfig, GopherRepetitionConfig
from tasks.ingest.quality import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
    dup_ngram_char_frac,
    top_ngram_char_frac,
)
from tasks.ingest.text import count_sentences, split_paragraphs, split_words

# Eight words of 4–7 letters, none of them a Gopher stop word.
FILLER = "rivers flow past green hills toward distant towns".split()

# Twelve sentences sharing no word, so they repeat nothing.
SENTENCES = [
    "Quartz pebbles glitter beneath shallow mountain streams.",
    "Seven hungry gulls circled above fishing boats.",
    "Old lanterns swayed gently inside creaky barns.",
    "Copper kettles whistled during frosty mornings.",
    "Bright kites danced over windy meadows.",
    "Patient farmers harvested golden wheat fields.",
    "Curious otters explored muddy riverbanks quietly.",
    "Tall pines guarded snowy northern valleys.",
    "Silver trains rattled across iron bridges.",
    "Young painters sketched crumbling stone chapels.",
    "Heavy clouds drifted toward distant islands.",
    "Clever ravens hid shiny buttons somewhere.",
]


def filler(n: int) -> str:
    return " ".join(FILLER[i % len(FILLER)] for i in range(n))


def verdict(step, text: str, source: str = "web") -> tuple[str | None, Stats, Document]:
    """(drop reason or None, stats, the document after the step)."""
    stats = Stats()
    doc = Document(id="d", url="", text=text, source=source)
    kept = list(step.run([doc], stats))
    reasons = [k[len("dropped."):] for k in stats if k.startswith("dropped.")]
    assert len(kept) + len(reasons) == 1
    return (reasons[0] if reasons else None), stats, doc


# ------------------------------------------------------------------------------------------------
# text helpers


def test_words_exclude_punctuation_and_keep_inner_joiners():
    assert split_words("Don't stop — e-mail me at 3.14, #now...") == ["Don't", "stop", "e-mail", "me", "at", "3.14", "now"]


def test_sentences_are_counted_at_terminal_punctuation():
    assert count_sentences("One here. Two there! Three? \"Four.\" five") == 5
    assert count_sentences("No end") == 1
    assert count_sentences("...") == 0


def test_paragraphs_split_on_blank_lines_even_with_spaces():
    assert split_paragraphs("a\nb\n\nc\n  \n\nd\n") == ["a\nb", "c", "d"]


# ------------------------------------------------------------------------------------------------
# Gopher quality


def gopher(**overrides) -> GopherQualityFilter:
    return GopherQualityFilter(GopherQualityConfig(**overrides))


def test_gopher_defaults_are_the_published_values():
    cfg = GopherQualityConfig()
    assert (cfg.min_words, cfg.max_words) == (50, 100_000)
    assert (cfg.min_mean_word_length, cfg.max_mean_word_length) == (3, 10)
    assert (cfg.max_symbol_word_ratio, cfg.max_bullet_lines_frac, cfg.max_ellipsis_lines_frac) == (0.1, 0.9, 0.3)
    assert (cfg.min_alpha_words_frac, cfg.min_stop_words) == (0.8, 2)
    assert cfg.stop_words == ["the", "be", "to", "of", "and", "that", "have", "with"]


def test_gopher_keeps_fifty_words_and_drops_forty_nine():
    assert verdict(gopher(), filler(48) + " the and")[0] is None
    assert verdict(gopher(), filler(47) + " the and")[0] == "gopher_short_doc"


def test_gopher_drops_empty_text_as_short():
    assert verdict(gopher(), "")[0] == "gopher_short_doc"
    assert verdict(gopher(min_words=0), "  \n ")[0] == "gopher_short_doc"


def test_gopher_drops_documents_over_max_words():
    assert verdict(gopher(max_words=50), filler(48) + " the and")[0] is None
    assert verdict(gopher(max_words=50), filler(49) + " the and")[0] == "gopher_long_doc"


def test_gopher_mean_word_length_bounds_are_inclusive():
    three_letters = " ".join(["the", "cat", "and", "dog", "ran", "far", "off"] * 8)[: 4 * 50 - 1]
    assert len(split_words(three_letters)) == 50
    assert verdict(gopher(), three_letters)[0] is None  # mean 3.0
    assert verdict(gopher(), three_letters[:-3] + "on")[0] == "gopher_mean_word_length"  # mean 2.98

    ten_letters = " ".join(["everything", "underneath", "incredible", "completely"] * 13)
    words = split_words(ten_letters)[:50]
    assert verdict(gopher(min_stop_words=0), " ".join(words))[0] is None  # mean 10.0
    longer = " ".join(words[:-1] + ["completelyy"])
    assert verdict(gopher(min_stop_words=0), longer)[0] == "gopher_mean_word_length"  # mean 10.02


def test_gopher_allows_one_hash_per_ten_words_and_no_more():
    body = filler(48) + " the and"
    assert verdict(gopher(), body + " #" * 5)[0] is None
    assert verdict(gopher(), body + " #" * 6)[0] == "gopher_symbol_ratio"


def test_gopher_counts_both_ellipsis_forms_as_symbols():
    words = (filler(48) + " the and").split()
    five = " ".join(w + ("..." if i in (3, 9, 15) else "…" if i in (21, 27) else "") for i, w in enumerate(words))
    six = five.replace("rivers", "rivers...", 1)
    assert verdict(gopher(), five)[0] is None
    assert verdict(gopher(), six)[0] == "gopher_symbol_ratio"


def test_gopher_allows_ninety_percent_bullet_lines():
    lines = [f"- {filler(8)} the and" for _ in range(10)]
    assert verdict(gopher(), "\n".join(lines))[0] == "gopher_bullet_lines"
    lines[0] = lines[0][2:]
    assert verdict(gopher(), "\n".join(lines))[0] is None
    bulleted = "\n\n".join("• " + line[2:] for line in lines[1:])  # blank lines do not count as lines
    assert verdict(gopher(), bulleted)[0] == "gopher_bullet_lines"


def test_gopher_allows_thirty_percent_lines_ending_in_ellipsis():
    lines = [f"{filler(8)} the and" for _ in range(10)]
    three = [line + ("..." if i < 3 else ".") for i, line in enumerate(lines)]
    four = [line + ("…" if i < 4 else ".") for i, line in enumerate(lines)]
    assert verdict(gopher(), "\n".join(three))[0] is None
    assert verdict(gopher(), "\n".join(four))[0] == "gopher_ellipsis_lines"


def test_gopher_requires_eighty_percent_alphabetic_words():
    words = (filler(48) + " the and").split()
    ten_numbers = " ".join("2024" if i < 10 else w for i, w in enumerate(words))
    eleven_numbers = " ".join("2024" if i < 11 else w for i, w in enumerate(words))
    assert verdict(gopher(), ten_numbers)[0] is None
    assert verdict(gopher(), eleven_numbers)[0] == "gopher_alpha_words"


def test_gopher_needs_two_stop_words_in_any_case():
    assert verdict(gopher(), filler(48) + " The AND")[0] is None
    assert verdict(gopher(), filler(49) + " the")[0] == "gopher_too_few_stop_words"


def test_prose_filters_skip_code_documents_and_count_them():
    reason, stats, _ = verdict(gopher(), "x = 1", source="code")
    assert reason is None
    assert stats == {"in": 1, "out": 1, "skipped.code": 1}
    stats = Stats()
    doc = Document(id="d", url="", text="{}", meta={"format": "code"})
    assert list(C4QualityFilter(C4Config()).run([doc], stats)) == [doc]
    assert stats == {"in": 1, "out": 1, "skipped.code": 1}


def test_disabled_filter_passes_everything_without_counting():
    reason, stats, _ = verdict(gopher(enabled=False), "")
    assert reason is None and stats == {}


def test_filters_pickle_with_their_config():
    step = pickle.loads(pickle.dumps(gopher(min_words=7)))
    assert step.cfg.min_words == 7


def test_rejects_are_collected_with_their_reason():
    rejects: list[Document] = []
    list(gopher().run([Document(id="d", url="", text="too short")], Stats(), rejects))
    assert [d.meta["dropped_by"] for d in rejects] == ["gopher_short_doc"]


# ------------------------------------------------------------------------------------------------
# Gopher repetition


def repetition(**overrides) -> GopherRepetitionFilter:
    return GopherRepetitionFilter(GopherRepetitionConfig(**overrides))


def test_repetition_defaults_are_table_a1():
    cfg = GopherRepetitionConfig()
    assert (cfg.max_dup_line_frac, cfg.max_dup_para_frac) == (0.3, 0.3)
    assert (cfg.max_dup_line_char_frac, cfg.max_dup_para_char_frac) == (0.2, 0.2)
    assert cfg.max_top_ngram_char_frac == {2: 0.2, 3: 0.18, 4: 0.16}
    assert cfg.max_dup_ngram_char_frac == {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


def test_repetition_ngram_tables_accept_toml_string_keys():
    cfg = GopherRepetitionConfig(max_top_ngram_char_frac={"3": 0.5})
    assert cfg.max_top_ngram_char_frac == {3: 0.5}
    with pytest.raises(ValueError, match="fractions"):
        GopherRepetitionConfig(max_dup_ngram_char_frac={"five": 0.1})


def test_repetition_keeps_text_that_repeats_nothing():
    assert verdict(repetition(), "\n".join(SENTENCES))[0] is None
    assert verdict(repetition(), "\n\n".join(SENTENCES))[0] is None
    assert verdict(repetition(), "")[0] is None


def test_repetition_allows_thirty_percent_duplicate_lines():
    three_dups = "\n".join(SENTENCES[:6] + ["Short."] * 4)  # 3 of 10 lines repeat an earlier one
    four_dups = "\n".join(SENTENCES[:6] + ["Short."] * 5)  # 4 of 11
    assert verdict(repetition(), three_dups)[0] is None
    assert verdict(repetition(), four_dups)[0] == "gopher_dup_line_frac"


def test_repetition_allows_thirty_percent_duplicate_paragraphs():
    three_dups = "\n\n".join(SENTENCES[:6] + ["Short."] * 4)
    four_dups = "\n\n".join(SENTENCES[:6] + ["Short."] * 5)
    assert verdict(repetition(), three_dups)[0] is None
    assert verdict(repetition(), four_dups)[0] == "gopher_dup_para_frac"


def test_repetition_duplicate_paragraph_characters_at_threshold():
    long_para = " ".join(SENTENCES[:4])
    text = "\n\n".join([long_para, SENTENCES[5], SENTENCES[6], long_para])
    frac = len(long_para) / len(text)
    relaxed = dict(max_dup_line_char_frac=1.0, max_top_ngram_char_frac={}, max_dup_ngram_char_frac={})
    assert verdict(repetition(max_dup_para_char_frac=frac, **relaxed), text)[0] is None
    assert verdict(repetition(max_dup_para_char_frac=frac - 1e-9), text)[0] == "gopher_dup_para_char_frac"
    assert verdict(repetition(), text)[0] == "gopher_dup_para_char_frac"  # ~0.45 > 0.2


def test_repetition_duplicate_line_characters_at_threshold():
    long_line = " ".join(SENTENCES[:4])
    text = "\n".join([long_line, SENTENCES[5], SENTENCES[6], long_line])
    frac = len(long_line) / len(text)
    assert verdict(repetition(max_dup_line_char_frac=frac, max_top_ngram_char_frac={}, max_dup_ngram_char_frac={}), text)[0] is None
    assert verdict(repetition(max_dup_line_char_frac=frac - 1e-9), text)[0] == "gopher_dup_line_char_frac"


def test_top_ngram_fraction_counts_every_occurrence_of_the_most_frequent():
    words = ["ab", "c", "ab", "c", "d"]
    assert top_ngram_char_frac(words, 2, total_chars=8) == pytest.approx(2 * 3 / 8)
    assert top_ngram_char_frac(["a", "b", "c"], 2, total_chars=3) == 0.0  # nothing repeats


def test_dup_ngram_fraction_covers_repeats_once_even_when_they_overlap():
    words = "a b c a b c a b c".split()
    # 2-grams repeat from position 3 on: words 3..8 are covered, 6 of 9 characters
    assert dup_ngram_char_frac(words, 2, total_chars=9) == pytest.approx(6 / 9)
    assert dup_ngram_char_frac(words, 4, total_chars=9) == pytest.approx(6 / 9)
    assert dup_ngram_char_frac(words, 7, total_chars=9) == 0.0


def test_repetition_drops_a_dominant_two_gram():
    text = SENTENCES[0] + " big dog big dog big dog"
    assert verdict(repetition(), text)[0] == "gopher_top_2_gram"
    words = [w.lower() for w in split_words(text)]
    frac = top_ngram_char_frac(words, 2, sum(map(len, words)))
    assert verdict(repetition(max_top_ngram_char_frac={2: frac}, max_dup_ngram_char_frac={}), text)[0] is None
    assert verdict(repetition(max_top_ngram_char_frac={2: frac - 1e-9}), text)[0] == "gopher_top_2_gram"


def test_repetition_drops_repeated_five_grams_at_threshold():
    text = " ".join([SENTENCES[0], SENTENCES[1], SENTENCES[2], SENTENCES[0]])
    words = [w.lower() for w in split_words(text)]
    frac = dup_ngram_char_frac(words, 5, sum(map(len, words)))
    assert frac == pytest.approx(49 / sum(map(len, words)))  # the second "Quartz … streams" is covered
    no_top = dict(max_top_ngram_char_frac={})
    assert verdict(repetition(max_dup_ngram_char_frac={5: frac}, **no_top), text)[0] is None
    assert verdict(repetition(max_dup_ngram_char_frac={5: frac - 1e-9}, **no_top), text)[0] == "gopher_dup_5_gram"


# ------------------------------------------------------------------------------------------------
# C4


def c4(**overrides) -> C4QualityFilter:
    return C4QualityFilter(C4Config(**overrides))


GOOD_LINES = SENTENCES[:5]


def test_c4_removes_bad_lines_and_keeps_the_page():
    text = "\n".join(
        [
            "Home | About | Contact",  # no terminal punctuation
            GOOD_LINES[0],
            "Thanks!",  # one word
            GOOD_LINES[1],
            "Please enable JavaScript to view comments.",
            GOOD_LINES[2],
            "This site uses cookies to improve your experience.",
            GOOD_LINES[3],
            "Read more...",  # an ellipsis is not terminal punctuation
            GOOD_LINES[4],
        ]
    )
    reason, stats, doc = verdict(c4(), text)
    assert reason is None
    assert doc.text == "\n".join(GOOD_LINES)
    assert stats.with_prefix("lines_removed.") == {
        "javascript": 1,
        "no_terminal_punct": 2,
        "policy": 1,
        "too_few_words": 1,
    }


def test_c4_needs_five_sentences_after_line_removal():
    assert verdict(c4(), "\n".join(GOOD_LINES))[0] is None
    assert verdict(c4(), "\n".join(GOOD_LINES[:4] + ["No punctuation here"]))[0] == "c4_too_few_sentences"
    two_per_line = "\n".join([GOOD_LINES[0] + " " + GOOD_LINES[1], GOOD_LINES[2] + " " + GOOD_LINES[3], GOOD_LINES[4]])
    assert verdict(c4(), two_per_line)[0] is None
    assert verdict(c4(), "")[0] == "c4_too_few_sentences"


def test_c4_min_words_per_line_is_inclusive():
    five = "\n".join(GOOD_LINES)
    assert verdict(c4(), five + "\nThree words here.")[2].text.endswith("Three words here.")
    assert verdict(c4(), five + "\nTwo words.")[2].text == five


def test_c4_drops_lorem_ipsum_pages_in_any_case():
    assert verdict(c4(), "\n".join(GOOD_LINES) + "\nLorem Ipsum dolor sit amet.")[0] == "c4_lorem_ipsum"


def test_c4_drops_pages_with_a_curly_bracket_unless_configured():
    text = "\n".join(GOOD_LINES) + "\nUse the {name} field for it."
    assert verdict(c4(), text)[0] == "c4_curly_bracket"
    assert verdict(c4(drop_curly_bracket=False), text)[0] is None


def test_c4_removes_lines_with_over_long_words():
    five = "\n".join(GOOD_LINES)
    assert verdict(c4(max_word_length=10), five + "\nThis has abcdefghij here.")[2].text.endswith("here.")
    reason, stats, doc = verdict(c4(max_word_length=10), five + "\nThis has abcdefghijk here.")
    assert doc.text == five and stats["lines_removed.too_long_word"] == 1


def test_c4_strips_citations_before_checking_punctuation():
    text = "\n".join(GOOD_LINES[:4] + ["The tower was finished in 1889.[1]"])
    reason, _, doc = verdict(c4(), text)
    assert reason is None and doc.text.endswith("finished in 1889.")


def test_c4_keeps_unpunctuated_lines_when_configured_like_fineweb():
    text = "\n".join(GOOD_LINES + ["A heading without a period"])
    assert verdict(c4(drop_lines_without_terminal_punct=False), text)[2].text == text


# ------------------------------------------------------------------------------------------------
# FineWeb


def fineweb(**overrides) -> FineWebQualityFilter:
    return FineWebQualityFilter(FineWebConfig(**overrides))


def long_line(i: int, end: str = ".") -> str:
    return f"Line number {i} talks about a different topic entirely{end}"


def test_fineweb_defaults_are_the_published_values():
    cfg = FineWebConfig()
    assert (cfg.min_line_punct_frac, cfg.max_short_line_frac, cfg.short_line_length) == (0.12, 0.67, 30)
    assert (cfg.max_dup_line_char_frac, cfg.max_newline_word_ratio) == (0.01, 0.3)


def test_fineweb_drops_at_twelve_percent_of_lines_punctuated():
    three = "\n".join(long_line(i, "." if i < 3 else "") for i in range(25))  # 0.12
    four = "\n".join(long_line(i, "." if i < 4 else "") for i in range(25))  # 0.16
    assert verdict(fineweb(), three)[0] == "fineweb_line_punct_ratio"
    assert verdict(fineweb(), four)[0] is None


def test_fineweb_drops_at_sixty_seven_percent_short_lines():
    def doc(n_short: int) -> str:
        return "\n".join([f"Short line number {i}." for i in range(n_short)] + [long_line(i) for i in range(100 - n_short)])

    assert verdict(fineweb(), doc(67))[0] == "fineweb_short_line_ratio"
    assert verdict(fineweb(), doc(66))[0] is None


def test_fineweb_short_line_length_is_inclusive():
    thirty = "Exactly thirty characters now."
    assert len(thirty) == 30
    assert verdict(fineweb(max_short_line_frac=0.5), thirty + "\n" + long_line(1))[0] == "fineweb_short_line_ratio"
    assert verdict(fineweb(max_short_line_frac=0.5), thirty[:-1] + "!." + "\n" + long_line(1))[0] is None


def test_fineweb_duplicate_line_characters_at_threshold():
    lines = [long_line(i) for i in range(50)] + [long_line(7)]
    text = "\n".join(lines)
    frac = len(long_line(7)) / len(text.replace("\n", ""))
    assert verdict(fineweb(max_dup_line_char_frac=frac), text)[0] == "fineweb_dup_line_chars"
    assert verdict(fineweb(max_dup_line_char_frac=frac + 1e-9), text)[0] is None
    assert verdict(fineweb(), text)[0] == "fineweb_dup_line_chars"  # ~0.02 ≥ 0.01


def test_fineweb_allows_three_newlines_per_ten_words():
    lines = [
        "Extraordinarily comprehensive documentation.",
        "Unquestionably meticulous proofreading.",
        "Incomprehensibly convoluted bureaucracy.",
        "Antidisestablishmentarianism.",
    ]
    at_ratio = "\n".join(lines)
    assert len(split_words(at_ratio)) == 10
    assert verdict(fineweb(), at_ratio)[0] is None
    above = at_ratio.replace("Unquestionably meticulous", "Unquestionably")
    assert verdict(fineweb(), above)[0] == "fineweb_newline_ratio"


def test_fineweb_drops_empty_text():
    assert verdict(fineweb(), "")[0] == "fineweb_line_punct_ratio"


def test_fineweb_ignores_blank_lines():
    text = "\n\n".join(long_line(i) for i in range(5))
    assert verdict(fineweb(max_newline_word_ratio=1.0), text)[0] is None



def test_a_kept_document_carries_what_each_rule_measured_on_it():
    """meta["quality"][<filter>]: the values smelt trace shows beside a document a loss spike drew."""
    text = " ".join(SENTENCES) + " the and of"
    reason, _, doc = verdict(gopher(min_words=10), text)
    assert reason is None
    values = doc.meta["quality"]["gopher_quality"]
    words = len(split_words(text))
    assert values["words"] == words and values["stop_words"] == 3 and values["alpha_words"] == 1.0
    assert values["mean_word_length"] == float(f"{sum(map(len, split_words(text))) / words:.4g}")
    dropped, _, short = verdict(gopher(), "too short")
    assert dropped == "gopher_short_doc" and "quality" not in short.meta  # only kept documents are recorded

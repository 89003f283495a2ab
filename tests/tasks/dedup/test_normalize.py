from tasks.dedup.normalize import normalize_text, normalized_words


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

"""Line splitting over a chunk stream (``tasks/records._bounded_lines``): limits and markers at chunk edges."""

from __future__ import annotations

from tasks.compression import GAP, MEMBER_END
from tasks.records import TOO_LONG, _bounded_lines


def lines(chunks, max_bytes=5):
    return list(_bounded_lines(iter(chunks), max_bytes))


def test_lines_split_across_chunks_are_joined_and_the_limit_counts_the_text_not_the_newline():
    assert lines([b"ab", b"cde\nfg", b"hij", b"\n"]) == [b"abcde\n", b"fghij\n"]
    assert lines([b"ab", b"cde\nfg", b"hijk", b"\n"]) == [b"abcde\n", TOO_LONG]
    assert lines([b"12345\n123456\n", b"x"]) == [b"12345\n", TOO_LONG, b"x"]


def test_a_long_line_is_skipped_across_chunks_without_being_kept():
    assert lines([b"123", b"4567", b"89", b"0\nok\n"]) == [TOO_LONG, b"ok\n"]
    assert lines([b"1234567"]) == [TOO_LONG]  # at the end, no newline


def test_markers_stay_in_place_and_a_gap_lets_the_line_it_cut_out_first():
    assert lines([b"ab\ncd", MEMBER_END, b"e\n", b"fg", GAP, b"h\n"]) == [
        b"ab\n", MEMBER_END, b"cde\n", b"fg", GAP, b"h\n"]
    assert lines([b"1234567", GAP, b"ok\n"]) == [TOO_LONG, GAP, b"ok\n"]

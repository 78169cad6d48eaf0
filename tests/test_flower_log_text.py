"""What the coordinator shows of a site's own text: no terminal codes, and no line that passes for its own (a
security audit's site sent an error reason with a newline and "FAKE: all sites OK")."""

from __future__ import annotations

from fedseg.flower.log_text import SITE_TEXT_LIMIT, site_text


def test_a_sites_further_lines_are_marked_and_its_control_codes_escaped():
    shown = site_text('=HYPERLINK("x")\x1b[2J\x1b[31mFAKE: all sites OK\r\nline2\nline3')
    lines = shown.split("\n")
    assert lines[0] == '=HYPERLINK("x")\\x1b[2J\\x1b[31mFAKE: all sites OK'
    assert lines[1:] == ["  | line2", "  | line3"]  # never at the start of a line
    assert "\x1b" not in shown and "\r" not in shown


def test_a_long_text_is_cut_and_says_how_much():
    shown = site_text("x" * (SITE_TEXT_LIMIT + 10))
    assert shown.endswith(" … (10 more characters)") and len(shown) < SITE_TEXT_LIMIT + 40

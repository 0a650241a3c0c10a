"""The pure parts of bench/server/bench_union.py: held-out prompts, token events, agreement."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "server"))
import bench_union as bu  # noqa: E402


def test_heldout_prompts_are_cut_at_a_word_and_the_warmup_set_differs():
    text = "\n\n".join(f"paragraph {i} " + "word " * 30 for i in range(40)) + "\n\nshort"
    got = bu.heldout_prompts(text, 4, 50)
    warm = bu.heldout_prompts(text, 4, 50, skip=1)
    assert len(got) == 4 and all(len(p) <= 50 and not p.endswith(" ") for p in got)
    assert not set(got) & set(warm)
    with pytest.raises(ValueError, match="paragraphs"):
        bu.heldout_prompts("one\n\ntwo", 4, 50)


def test_event_pieces_keep_token_events_only():
    evs = [(0, {"choices": [{"text": "a"}]}), (1, {"choices": [{"text": ""}]}),
           (2, {"choices": [{"token_ids": [5, 6]}]}), (3, {"usage": {"completion_tokens": 3}, "choices": []})]
    assert bu.event_pieces(evs) == ["a", "5", "6"]


def test_token_agreement_counts_positions_and_whole_streams():
    refs = [["a", "b", "c"], ["x", "y"]]
    assert bu.token_agreement(refs, refs) == (1.0, 2)
    share, whole = bu.token_agreement([["a", "q", "c"], ["x", "y"]], refs)
    assert share == pytest.approx(4 / 5) and whole == 1


def test_config_order_interleaves():
    assert bu.config_order([1, 2, 3], 1) == [1, 2, 3]
    assert bu.config_order([1, 2, 3], 2) == [3, 2, 1]

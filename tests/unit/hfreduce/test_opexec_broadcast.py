"""A broadcast's int32 words, as both the engine and the express path build them."""

from __future__ import annotations

import numpy as np

from fireflyer.hfreduce.opexec import _WorkBuffers, broadcast_words, wire_layout


def test_the_roots_bytes_are_padded_with_zeros_and_other_nodes_give_zeros_even_in_reused_scratch() -> None:
    scratch = _WorkBuffers()
    scratch.get(np.dtype(np.int32), 16)[:] = -1  # a previous op's words: every bit set
    src = np.arange(1, 7, dtype=np.uint8)  # 6 bytes: one whole word and half of another
    _, _, words = wire_layout("broadcast", "sum", np.dtype(np.uint16), 3)
    assert words == 2
    got = broadcast_words(scratch, src, words)
    assert got.dtype == np.int32 and got.size == 2
    assert got.view(np.uint8).tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
    scratch.get(np.dtype(np.int32), 16)[:] = -1
    assert broadcast_words(scratch, None, words).tolist() == [0, 0]

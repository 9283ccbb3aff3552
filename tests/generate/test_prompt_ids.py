"""A text prompt's ids: BOS first exactly where the tokenizer's file says its model expects one."""

from tformer.generate.search import prompt_ids


class _Tok:
    def __init__(self, add_bos, bos_id=7):
        self.add_bos, self.bos_id = add_bos, bos_id

    def encode(self, text):
        return [ord(c) % 5 for c in text]


def test_bos_only_where_the_file_adds_it_and_never_twice():
    assert prompt_ids(_Tok(True), "ab") == [7, 2, 3]
    assert prompt_ids(_Tok(False), "ab") == [2, 3]  # SmolLM2's file adds none
    assert prompt_ids(_Tok(True, bos_id=3), "bx") == [3, 0]  # the text already starts with the BOS id
    assert prompt_ids(_Tok(True, bos_id=None), "ab") == [2, 3]

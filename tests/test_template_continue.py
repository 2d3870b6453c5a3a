"""`continue_final_message`: the prompt ends inside the last message, as transformers renders it."""

import pytest
from transformers import PreTrainedTokenizerFast
from tokenizers import Tokenizer, models

from inference.templates import FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError

MESSAGES = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2, 3"}]


def test_the_prompt_ends_right_after_the_cut_off_answer():
    text = ChatTemplate(FALLBACK_TEMPLATE).render(MESSAGES, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n1, 2, 3")
    assert text == ChatTemplate(FALLBACK_TEMPLATE).render(MESSAGES, add_generation_prompt=False)[: len(text)]


def test_it_matches_transformers():
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    tok.chat_template = FALLBACK_TEMPLATE
    ref = tok.apply_chat_template(MESSAGES, tokenize=False, continue_final_message=True)
    assert ChatTemplate(FALLBACK_TEMPLATE).render(MESSAGES, continue_final_message=True) == ref


def test_an_empty_last_message_cannot_be_continued():
    with pytest.raises(ChatTemplateError, match="needs a last message with text"):
        ChatTemplate(FALLBACK_TEMPLATE).render(
            MESSAGES[:1] + [{"role": "assistant", "content": ""}], continue_final_message=True
        )

"""`paraplan serve` input checks: pins and engine limits that cannot work are one line, exit 2."""

from __future__ import annotations

import pytest
from support import assert_user_error, run


@pytest.mark.parametrize("flags, needle", [
    (["--ep", "2"], "--ep=2"),                                   # dense model: no experts
    (["--expert-cache", "0.5"], "--expert-cache=0.5"),
    (["--model", "mixtral-8x7b", "--ep", "3"], "allowed with the other pins on 8 GPUs: 1, 2, 4, 8"),
    (["--tp", "16"], "--tp=16"),
    (["--max-num-tokens", "1"], "must be >= the prompt (1024 tokens)"),   # never admits a prompt
    (["--max-num-tokens", "16", "--chunked-prefill"], "must be >= --max-batch (2048)"),
    (["--rate", "inf"], "finite"),
])
def test_serve_refuses_what_cannot_work(flags, needle, capsys):
    code, out, err = run(capsys, "serve", *flags)
    line = assert_user_error(code, out, err)
    assert needle in line, line

"""`paraplan serve` input checks: pins and engine limits that cannot work are one line, exit 2."""

from __future__ import annotations

import pytest
from support import assert_user_error, run


@pytest.mark.parametrize("flags, needle", [
    (["--ep", "2"], "--ep=2"),                                   # dense model: no experts
    (["--expert-cache", "0.5"], "--expert-cache=0.5"),
    (["--model", "mixtral-8x7b", "--ep", "3"], "allowed with the other pins on 8 GPUs: 1, 2, 4, 8"),
    (["--model", "mixtral-8x7b", "--tp", "8", "--ep", "3"],                 # the pin no plan has is named
     "--ep=3 is not allowed; allowed with the other pins on 8 GPUs: 1, 2, 4, 8"),
    (["--tp", "16"], "--tp=16"),
    (["--max-num-tokens", "1"], "must be >= the prompt (1024 tokens)"),   # never admits a prompt
    (["--max-num-tokens", "16", "--chunked-prefill"], "must be >= --max-batch (2048)"),
    (["--rate", "inf"], "finite"),
])
def test_serve_refuses_what_cannot_work(flags, needle, capsys):
    code, out, err = run(capsys, "serve", *flags)
    line = assert_user_error(code, out, err)
    assert needle in line, line


def test_serve_one_output_token_prints_no_tpot(capsys):
    """One output token has no time per output token: "-", not nan; the goodput line says
    what its second rate is and prints the offered one."""
    code, out, err = run(capsys, "serve", "--model", "llama3.1-8b", "--gpus", "1", "--requests", "40",
                         "--prompt", "256", "--output", "1", "--tp", "1", "--weights", "fp8", "--kv", "fp8")
    assert code == 0, err
    assert "nan" not in out and "Warning" not in err
    tpot_row = next(line for line in out.splitlines() if line.startswith("TPOT ms"))
    assert tpot_row.split()[2:] == ["-"] * 4
    # the goodput line, wrapped at the terminal width onto indented continuation lines
    goodput = " ".join(out[out.index("\ngoodput") + 1:].split("\n\n")[0].split())
    assert "completed" in goodput and "offered 8 req/s" in goodput


def test_serve_one_output_token_json_has_no_tpot(capsys):
    """--json says the same as the table: no TPOT for one output token (null, not 0)."""
    import json
    code, out, err = run(capsys, "serve", "--model", "llama3.1-8b", "--gpus", "1", "--requests", "40",
                         "--prompt", "256", "--output", "1", "--tp", "1", "--weights", "fp8", "--kv", "fp8", "--json")
    assert code == 0, err
    best = json.loads(out)["ranked"][0]
    assert best["tpot_floor_s"] is None and best["ttft_floor_s"] > 0
    assert best["at_rate"]["tpot_p50_s"] is None and best["at_rate"]["ttft_p50_s"] > 0

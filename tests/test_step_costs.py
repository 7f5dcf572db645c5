"""python -m specbench.step_costs: per-step costs on random weights shaped by a config alone (tiny Qwen2 here)."""
import json

import pytest
from transformers import Qwen2Config

from specbench.step_costs import TREES, main


def tiny_checkpoint(directory, layers: int):
    Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(directory)
    return str(directory)


def test_every_method_is_timed_against_greedy_in_the_same_rounds(tmp_path, capsys):
    target, draft = tiny_checkpoint(tmp_path / "t", 2), tiny_checkpoint(tmp_path / "d", 1)
    out = tmp_path / "costs.json"
    main(["--target", target, "--draft", draft, "--dtype", "float32", "--draft-vocab", "40", "--rounds", "2",
          "--new-tokens", "6", "--prompt-tokens", "8", "--json", str(out)])
    table = json.loads(out.read_text())
    rows = table["rows"]
    assert list(rows)[:2] == ["greedy", "speculative γ=4"] and len(rows) == 2 + len(TREES)
    assert rows["greedy"]["cost"] == 1.0 and len(rows["greedy"]["ms"]) == 2
    for name, row in rows.items():
        assert row["ms_per_step"] > 0 and row["cost"] > 0, name
        # cost: the mean over rounds of this method's step over greedy's step timed in the same round
        ratios = [m / g for m, g in zip(row["ms"], rows["greedy"]["ms"])]
        assert row["cost"] == pytest.approx(sum(ratios) / len(ratios))
    assert table["dtype"] == "float32" and "griffin eagle2_gpu (K 10, D 6, 60 nodes)" in capsys.readouterr().out


def test_a_directory_without_a_config_is_named_before_anything_is_built(tmp_path):
    with pytest.raises(SystemExit, match=r"--target: .*has no config.json"):
        main(["--target", str(tmp_path)])

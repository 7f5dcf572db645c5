"""docs/running.md's tables of every method and dataset are generated from the configs and kept up to date."""
import shutil

import pytest

from specbench.conf_dir import CONF, group_options
from specbench.errors import ConfigError
from specbench.methods.engine_only import EngineMethod, loop_methods
from specbench.report import catalog


def test_running_md_holds_what_the_configs_render_now():
    text = catalog.DOC.read_text()
    assert catalog.generated_part(text) == catalog.render(), (
        "docs/running.md's method and dataset tables are out of date with conf/: run `make docs`")


@pytest.mark.parametrize("group, table", [("method", catalog.methods_table), ("data", catalog.data_table)])
def test_every_option_is_in_its_table(group, table):
    rendered = table()
    options = group_options(group, presets=True)
    assert options
    for name in options:
        row = f"| `{name}` |" if "/" not in name else f"`{group}={name}`"
        assert row in rendered, f"{group}={name} is missing from the generated tables"


@pytest.fixture
def conf(tmp_path):
    for group in ("method", "data"):
        shutil.copytree(CONF / group, tmp_path / group)
    return tmp_path


def test_a_new_method_config_appears_with_its_comment_and_backends(conf):
    (conf / "method" / "fake.yaml").write_text(
        "# A fake method for the catalog's test (SWIFT's class under another name, so on transformers alone): one\n"
        "# sentence is enough. The table leaves this one out.\n"
        "_target_: specbench.methods.swift.Swift\nname: fake\n")
    rendered = catalog.render(conf)
    assert ("| `fake` | A fake method for the catalog's test (SWIFT's class under another name, so on transformers "
            "alone): one sentence is enough. | engine=hf: transformers |") in rendered
    assert "| `fake` |" not in catalog.render()  # the real conf/ is untouched


def test_a_config_without_a_comment_is_described_by_its_class_and_presets_are_counted(conf):
    (conf / "method" / "bare.yaml").write_text("_target_: specbench.methods.engine_only.EngineMethod\n"
                                               "name: bare\nengine_method: mtp\n")
    (conf / "method" / "spec_bench").mkdir()
    (conf / "method" / "spec_bench" / "a.yaml").write_text("defaults:\n  - /method/speculative\n")
    (conf / "method" / "spec_bench" / "b.yaml").write_text("defaults:\n  - /method/greedy\n")
    (conf / "data" / "fake_data.yaml").write_text("defaults:\n  - gsm8k\n  - _self_\nname: fake_data\n"
                                                  "max_new_tokens: 7\n")
    rendered = catalog.render(conf)
    first_line = EngineMethod.__doc__.strip().splitlines()[0]
    assert f"| `bare` | {first_line} | engine=vllm only |" in rendered.replace("\\|", "|")
    assert "- `conf/method/spec_bench/`: 2 presets, `method=spec_bench/a`, `method=spec_bench/b`" in rendered
    assert "| `fake_data` | As `data=gsm8k`, with its own name, max_new_tokens. | `gsm8k_exact_match` | 7 |" in rendered


def test_a_sam_method_runs_only_where_its_fallback_does():
    rendered = catalog.methods_table()
    assert "| `sam_eagle` |" in rendered and "engine=hf: transformers |" in rendered.split("| `sam_eagle` |")[1]
    assert "engine=hf: transformers, llamacpp |" in rendered.split("| `sam_speculative` |")[1].split("\n")[0]


def test_an_engine_only_method_names_every_method_our_loops_run():
    names = loop_methods()
    assert "mtp" not in names and {"greedy", "speculative", "griffin", "hydra", "swift"} <= set(names)
    assert set(names) | {"mtp"} == set(group_options("method"))
    with pytest.raises(ConfigError, match=r"^method=mtp: runs only with engine=vllm \(it is vLLM's 'mtp'\); our own "
                                          r"loops \(engine=hf\) have confidence_sl, disco, .*token_recycling_cpu$"):
        EngineMethod("mtp", "mtp")

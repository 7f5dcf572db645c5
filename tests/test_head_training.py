"""Training draft heads: extraction (features of the target's own answers, resumable), the losses and TAT passes,
stages that resume and refuse to start without their predecessor, and the pipeline end to end on a tiny pair
(``python -m specbench.training.heads`` in-process, then ``method=griffin`` decoding with what it trained)."""
from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench import benchmark
from specbench.backends.torch.cached_lm import FeatureLM
from specbench.errors import ConfigError
from specbench.run.head_accounts import read_account
from specbench.models.heads.draft_head import DraftHead, HeadConfig, TargetParts
from specbench.models.tiny import build_tiny_pair
from specbench.training.heads.extract import (answer_eos, extract, generate_with_features, load_sequences,
                                              prefill_with_features, with_answer)
from specbench.training.heads.pipeline import HeadPipeline, comparable, stage_identity
from specbench.training.heads.train import (Stage, StageRun, TrainSettings, batches, draft_vocabulary,
                                            flushed_denormals, pass_losses, target_to_draft)

from .conftest import ROOT, TEST_DEVICE

PAIR = build_tiny_pair(name="tiny-llama", device=TEST_DEVICE)


def sharegpt_file(path, n: int):
    convs = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Tell me about item number {i} and why it matters so much today."},
        {"from": "gpt", "value": f"Item {i} matters because " + "it does " * i}]} for i in range(n)]
    path.write_text(json.dumps(convs)[:-25])  # cut short, like the package's file
    return path


def tiny_data(tmp_path, n=12, max_new=24):
    prompts = [(f"p{i}", f"prompt {i}: say something about {i * 7}") for i in range(n)]
    extract(PAIR, prompts, tmp_path, max_new, 5, 200, {"test": 1}, log=lambda m: None)
    return load_sequences(tmp_path)


def test_generated_features_equal_a_forward_over_the_sequence():
    prompts = [PAIR.encode("a much longer prompt than the other one"), PAIR.encode("short")]
    rows = generate_with_features(PAIR.target, prompts, 12, set(), pad_id=0)
    for prompt, row in zip(prompts, rows):
        assert row["ids"][:row["start"]].tolist() == prompt and len(row["ids"]) == len(prompt) + 11
        lm = FeatureLM(PAIR.target)
        lm.forward(row["ids"].tolist())
        assert row["hidden"].device.type == "cpu"  # shards hold CPU tensors, whatever device extracted them
        assert torch.allclose(row["hidden"], lm.features_at(range(len(row["ids"]))).cpu(), atol=1e-4)
    from specbench.methods.greedy import Greedy
    assert rows[1]["ids"][rows[1]["start"]:].tolist() == Greedy(PAIR, "g").generate(prompts[1], 11, set()).tokens


def test_given_answers_are_read_in_one_pass_with_the_features_a_forward_gives():
    prompt = PAIR.encode("a prompt")
    answer = PAIR.tokenizer("the reply text", add_special_tokens=False)["input_ids"]
    eos = answer_eos(PAIR)
    whole = with_answer(PAIR.tokenizer, prompt, "the reply text", 50, eos)
    assert whole == prompt + answer + [PAIR.tokenizer.eos_token_id]  # the reply fits: it ends with EOS
    cut = with_answer(PAIR.tokenizer, prompt, "the reply text", 2, eos)
    assert cut == prompt + answer[:2]  # cut at the budget: no EOS
    short = with_answer(PAIR.tokenizer, PAIR.encode("another, longer prompt here"), "x", 50, eos)
    rows = prefill_with_features(PAIR.target, [(whole, len(prompt)), (short, len(short) - 2)], pad_id=0)
    for ids, row in zip((whole, short), rows):
        assert row["ids"].tolist() == ids and row["hidden"].shape[0] == len(ids)
        lm = FeatureLM(PAIR.target)
        lm.forward(ids)
        assert row["hidden"].device.type == "cpu"
        assert torch.allclose(row["hidden"], lm.features_at(range(len(ids))).cpu(), atol=1e-4)
    assert rows[0]["start"] == len(prompt) and rows[1]["start"] == len(short) - 2


def test_extraction_resumes_and_refuses_other_settings(tmp_path):
    logs = []
    prompts = [(f"p{i}", f"prompt {i}") for i in range(7)]
    extract(PAIR, prompts[:4], tmp_path, 8, 3, 200, {"v": 1}, log=logs.append)
    extract(PAIR, prompts, tmp_path, 8, 3, 200, {"v": 1}, log=logs.append)
    assert any("4 prompt(s) kept, 3 to run" in m for m in logs)
    assert sorted(row["id"] for row in load_sequences(tmp_path)) == sorted(p for p, _ in prompts)
    with pytest.raises(ConfigError, match=r"^heads\.data: .* holds data made with other settings \(v\)"):
        extract(PAIR, prompts, tmp_path, 8, 3, 200, {"v": 2}, log=logs.append)
    with pytest.raises(ConfigError, match=r"run the extract stage first"):
        load_sequences(tmp_path / "empty")


def test_the_draft_vocabulary_keeps_the_most_frequent_answer_tokens_and_eos():
    seqs = [{"ids": torch.tensor([9, 9, 5, 5, 5, 7, 2]), "start": 2}]
    ids = draft_vocabulary(seqs, 3, 20, always={19})
    assert ids.tolist() == [2, 5, 19]  # 5 (x3), EOS 19, then the lower id of the count-1 answer tokens 2 and 7
    assert draft_vocabulary(seqs, 5, 20, always=set()).tolist() == [0, 2, 5, 7, 9]  # then prompt token 9, then id 0
    t2d = target_to_draft(ids, 20)
    assert t2d[ids].tolist() == [0, 1, 2] and int((t2d >= 0).sum()) == 3


def settings(**overrides) -> TrainSettings:
    base = dict(stages=[Stage(1, 1, 3e-3)], batch_tokens=200, max_length=64, warmup_steps=2, seed=0)
    base.update(overrides)
    return TrainSettings(**base)


def total_loss(head, parts, plan, s) -> float:
    with torch.no_grad():
        return sum(float(pass_losses(head, parts, b, 1, s, None, train=False)[0]) for b in plan)


def test_training_lowers_the_loss_and_raises_top1(tmp_path):
    sequences = tiny_data(tmp_path / "data")
    config = HeadConfig.for_target(PAIR.target.config, "griffin")
    head = DraftHead(config).init_weights(seed=0).to(PAIR.device)
    parts = TargetParts.of(PAIR.target, None)
    t2d = target_to_draft(None, config.vocab_size)
    s = settings(stages=[Stage(1, 12, 3e-3)], noise=0.0)
    plan = batches(sequences, s, t2d, seed=0)
    before = total_loss(head, parts, plan, s)
    run = StageRun(head, parts, s, s.stages[0], 1, tmp_path / "stage-1", log=lambda m: None)
    history = run.run(sequences, t2d)
    assert total_loss(head, parts, plan, s) < 0.8 * before
    assert history[-1]["top1"][0] > history[0]["top1"][0]


@pytest.mark.parametrize("kind", ["eagle", "griffin"])
def test_a_head_can_start_from_the_targets_last_layer(kind):
    config = HeadConfig.for_target(PAIR.target.config, kind)
    head = DraftHead(config).init_from_target(PAIR.target).to(PAIR.device)
    last = PAIR.target.model.layers[-1]
    assert torch.equal(head.self_attn.q_proj.weight, last.self_attn.q_proj.weight.float())
    down = last.mlp.down_proj.weight.float()
    assert torch.equal(head.mlp.down_proj.weight, torch.cat([down, down]) if kind == "griffin" else down)
    h = config.hidden_size
    e, f = torch.randn(1, 3, h, device=PAIR.device), torch.randn(1, 3, h, device=PAIR.device)
    assert torch.allclose(head.fusion.fc(torch.cat([e, f], -1)), f)  # the fc passes the feature through
    narrow = HeadConfig.for_target(PAIR.target.config, kind, intermediate_size=8)
    with pytest.raises(ConfigError, match=r"^head\.init: target_layer: .*head\.intermediate_size must be"):
        DraftHead(narrow).init_from_target(PAIR.target)


def test_later_passes_are_masked_by_alignment_of_the_drafts_before_them(tmp_path):
    sequences = tiny_data(tmp_path / "data")
    config = HeadConfig.for_target(PAIR.target.config, "griffin")
    head = DraftHead(config).init_weights(seed=0).to(PAIR.device)
    parts, t2d = TargetParts.of(PAIR.target, None), target_to_draft(None, config.vocab_size)
    batch = batches(sequences, settings(), t2d, seed=0)[0].to(PAIR.device)
    _, open_stats = pass_losses(head, parts, batch, 3, settings(align_top_k=0), None, train=False)
    _, strict = pass_losses(head, parts, batch, 3, settings(align_top_k=1), None, train=False)
    _, loose = pass_losses(head, parts, batch, 3, settings(align_top_k=config.vocab_size), None, train=False)
    counted = [s["positions"] for s in open_stats]
    assert counted[0] == batch.mask.sum() and counted == [s["positions"] for s in loose] == [counted[0]] * 3
    # top-1: pass 2 keeps position t only where pass 1's top-1 at t - 1 (the token pass 2 reads at t) was right
    with torch.no_grad():
        positions = torch.arange(batch.tokens_in.shape[1], device=PAIR.device)[None].expand_as(batch.tokens_in)
        predict, _ = head(parts.embed(batch.tokens_in), batch.feats_in, positions)
        hit = (parts.logits(predict).argmax(-1) == batch.next_draft).float()
    assert strict[0]["positions"] == counted[0]
    assert strict[1]["positions"] == float((batch.mask[:, 1:] * hit[:, :-1]).sum()) < counted[0]
    assert strict[2]["positions"] <= strict[1]["positions"]


def full_sequence_losses(head, parts, batch, passes, s):
    """pass_losses written plainly, lm_head over every position (the reference its row selection must equal)."""
    batch, device = batch.to(parts.device), parts.device
    b, m = batch.tokens_in.shape
    embeds, inputs = parts.embed(batch.tokens_in).float(), batch.feats_in
    positions = torch.arange(m, device=device)[None].expand(b, m)
    p = torch.softmax(parts.logits(batch.feats_out).float(), -1)
    top_p = p.topk(s.topk_loss_k, dim=-1) if passes >= 2 and s.topk_loss_weight else None
    streams, aligned, total, stats = [], torch.ones(b, m, device=device), 0.0, []
    for index in range(1, passes + 1):
        predict, regress = head(embeds, inputs, positions, streams=streams)
        logq = torch.log_softmax(parts.logits(predict).float(), -1)
        weight = batch.mask * aligned
        feature_loss = torch.nn.functional.smooth_l1_loss(regress, batch.feats_out, reduction="none").mean(-1)
        loss = s.feature_weight * feature_loss
        loss = loss + s.ce_weight * -(p * logq).sum(-1)
        if top_p is not None:
            loss = loss + s.topk_loss_weight * -(top_p.values * logq.gather(-1, top_p.indices)).sum(-1)
        total = total + (loss * weight).sum() / weight.sum().clamp_min(1.0) / passes
        in_top = (logq.topk(s.align_top_k, -1).indices == batch.next_draft[..., None]).any(-1).float()
        hit = (logq.argmax(-1) == batch.next_draft).float()
        stats.append({"positions": float(weight.sum()), "top1": float((hit * weight).sum()),
                      "in_top_k": float((in_top * weight).sum())})
        aligned = torch.cat([torch.zeros(b, 1, device=device), (in_top * aligned)[:, :-1]], 1)
        inputs = torch.cat([inputs[:, :1], regress[:, :-1]], 1)
    return total, stats


@torch.no_grad()
def test_the_loss_reads_lm_head_only_where_it_can_count_and_equals_the_full_sequence_formula(tmp_path):
    sequences = tiny_data(tmp_path / "data")
    config = HeadConfig.for_target(PAIR.target.config, "griffin", draft_vocab_size=60)
    draft_ids = draft_vocabulary(sequences, 60, config.vocab_size, set())
    parts, t2d = TargetParts.of(PAIR.target, draft_ids), target_to_draft(draft_ids, config.vocab_size)
    head = DraftHead(config).init_weights(seed=1, std=0.2).to(PAIR.device)
    s = settings(align_top_k=25)
    for batch in batches(sequences, s, t2d, seed=0)[:2]:
        assert 0 < batch.mask.sum() < batch.mask.numel()  # prompt and out-of-vocabulary positions are left out
        for passes in (1, 3):
            loss, stats = pass_losses(head, parts, batch, passes, s, None, train=False)
            reference, expected = full_sequence_losses(head, parts, batch, passes, s)
            assert float(loss) == pytest.approx(float(reference), rel=1e-5)
            for ours, theirs in zip(stats, expected):
                assert {k: ours[k] for k in theirs} == pytest.approx(theirs)
            assert passes == 1 or 0 < stats[2]["positions"] < stats[0]["positions"]


def test_a_killed_stage_resumes_to_the_same_head(tmp_path):
    sequences = tiny_data(tmp_path / "data")
    config = HeadConfig.for_target(PAIR.target.config, "eagle")
    parts, t2d = TargetParts.of(PAIR.target, None), target_to_draft(None, config.vocab_size)
    s = settings(stages=[Stage(2, 3, 1e-3)], checkpoint_seconds=0.0)

    whole = DraftHead(config).init_weights(seed=0).to(PAIR.device)
    StageRun(whole, parts, s, s.stages[0], 1, tmp_path / "a", log=lambda m: None).run(sequences, t2d)

    class Killed(Exception):
        pass

    def kill_at_step(message):
        if "step 10/" in message:
            raise Killed

    first = DraftHead(config).init_weights(seed=0).to(PAIR.device)
    with pytest.raises(Killed):
        StageRun(first, parts, s, s.stages[0], 1, tmp_path / "b", log=kill_at_step).run(sequences, t2d)
    assert (tmp_path / "b" / "partial.pt").exists()
    resumed = DraftHead(config).init_weights(seed=5).to(PAIR.device)  # its own weights are replaced by the checkpoint's
    logs = []
    StageRun(resumed, parts, s, s.stages[0], 1, tmp_path / "b", log=logs.append).run(sequences, t2d)
    assert any("resuming at step" in m for m in logs)
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name


def heads_cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="heads", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", f"data.path={sharegpt_file(tmp_path / 'sg.json', 14)}",
            "data.prompts=10", "data.max_new_tokens=20", "data.batch_size=4", "data.exclude=[]",
            "head.draft_vocab_size=120",
            "head.train.batch_tokens=256", "head.train.max_length=64", f"paths.root={tmp_path / 'runs'}",
            "head.train.stages=[{passes:1,epochs:2,lr:3e-3},{passes:2,epochs:1,lr:1e-3},{passes:3,epochs:1,lr:1e-3}]",
            *overrides])


def test_data_from_the_conversations_replies_is_its_own_directory(tmp_path):
    regenerated = HeadPipeline(heads_cfg(tmp_path))
    assert regenerated.data_identity() == HeadPipeline(heads_cfg(tmp_path, "data.answers=target")).data_identity()
    assert "answers" not in regenerated.data_identity()  # directories made before the option keep their hash
    given = HeadPipeline(heads_cfg(tmp_path, "data.answers=dataset", "stage=extract"))
    assert given.data_dir != regenerated.data_dir
    given.run("extract")
    sequences = load_sequences(given.data_dir)
    assert len(sequences) == 10
    for seq in sequences:
        reply = PAIR.decode(seq["ids"][seq["start"]:].tolist())
        replies = [f"Item {i} matters because " + "it does " * i for i in range(14)]
        assert any(r.startswith(reply) and len(reply) >= 15 for r in replies)  # the file's reply, not a generation
    with pytest.raises(ConfigError, match=r"^head\.init: must be one of \['random', 'target_layer'\]"):
        HeadPipeline(heads_cfg(tmp_path, "head.init=zeros"))
    # random (the default before the option existed) is left out: heads trained then keep their identity
    assert "init" not in HeadPipeline(heads_cfg(tmp_path, "head.init=random")).train_identity()["head"]
    assert regenerated.train_identity()["head"]["init"] == "target_layer"
    with pytest.raises(ConfigError, match=r"^heads\.data\.answers: must be one of \['target', 'dataset'\]"):
        HeadPipeline(heads_cfg(tmp_path, "data.answers=gpt4"))


def test_a_topic_pattern_is_part_of_the_datas_identity_and_checked_before_loading(tmp_path):
    every = HeadPipeline(heads_cfg(tmp_path))
    assert "match" not in every.data_identity()  # null, the value before the option: older directories keep their hash
    code = HeadPipeline(heads_cfg(tmp_path, "data.match='(?i)\\bpython\\b|```'"))
    assert code.data_identity()["match"] == "(?i)\\bpython\\b|```" and code.data_dir != every.data_dir
    with pytest.raises(ConfigError, match=r"^heads\.data\.match: '\(python' is not a regular expression"):
        HeadPipeline(heads_cfg(tmp_path, "data.match='(python'"))
    assert every._pair is None and code._pair is None
    named = re.compile(HeadPipeline(heads_cfg(tmp_path, "data.match=${topics.programming}")).data["match"])
    assert named.search("How do I reverse a list in Python?") and named.search("Fix this:\n```\nx = 1\n```")
    assert not named.search("Write a short poem about the sea at dawn")


def test_a_stage_without_its_predecessor_is_refused(tmp_path):
    cfg = heads_cfg(tmp_path, "stage=train", "train_stage=2")
    pipeline = HeadPipeline(cfg)
    pipeline.run("extract")
    with pytest.raises(ConfigError, match=r"^heads\.stage: stage 2 resumes from stage 1, but .*stage-1/head\.json "
                                          r"does not exist; run stage 1 first"):
        pipeline.run("train")
    with pytest.raises(ConfigError, match=r"^head\.train\.stages\[0\]: must have exactly passes, epochs and lr"):
        HeadPipeline(heads_cfg(tmp_path, "head.train.stages=[{passes:1}]"))


def test_pipeline_end_to_end_then_griffin_decodes_with_the_trained_head(tmp_path):
    cfg = heads_cfg(tmp_path)
    pipeline = HeadPipeline(cfg)
    pipeline.run("all")
    assert pipeline.pair.draft is None  # the pipeline never drafts with the pair's draft model: not loaded
    head_dir = tmp_path / "runs" / "heads" / "tiny-llama" / "griffin"
    meta = json.loads((head_dir / "head.json").read_text())
    assert meta["provenance"]["stage"] == 3 and meta["config"]["draft_vocab_size"] == 120
    evaluation = json.loads((head_dir / "evaluation.json").read_text())
    assert len(evaluation["depths"]) == 5 and 0 < evaluation["draft_vocab_coverage"] <= 1
    history = json.loads((head_dir / "history.json").read_text())
    assert sorted(history) == ["1", "2", "3"] and len(history["3"][0]["top1"]) == 3
    HeadPipeline(cfg).run("train")  # finished stages are kept, not retrained
    assert json.loads((head_dir / "head.json").read_text())["sha256"] == meta["sha256"]

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        run_cfg = compose(config_name="config", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", "method=griffin", f"paths.root={tmp_path / 'runs'}",
            "data=gsm8k", "data.limit=2", "data.max_new_tokens=12", "runner.warmup=0", "runner.progress=false"])
    summary = benchmark.run(run_cfg)
    assert summary["identical"] == summary["compared"] == 2
    records = next((tmp_path / "runs" / "records").rglob("*griffin*.jsonl"))
    record = json.loads(records.read_text().splitlines()[0])
    assert record["config"]["method"]["head_sha256"] == meta["sha256"]
    kept = read_account(records.parent, str(head_dir), meta["sha256"])  # the head's account, beside the records
    assert kept["evaluation"] == evaluation and kept["history"] == history and kept["head"] == meta
    assert kept["data"]["prompts"] == cfg.data.prompts and kept["train"]["data"].startswith("data-")


def test_ablations_copy_the_stages_they_share_with_griffin_and_train_the_rest(tmp_path):
    griffin = HeadPipeline(heads_cfg(tmp_path))
    griffin.run("extract")
    griffin.run("train")
    top1 = HeadPipeline(heads_cfg(tmp_path, "head.name=griffin_top1", "head.train.align_top_k=1"))
    top1.run("train")
    ours, theirs = top1.head_dir, griffin.head_dir
    made_by = [json.loads((ours / f"stage-{i}/head.json").read_text())["provenance"]["head"] for i in (1, 2, 3)]
    assert made_by == ["griffin", "griffin_top1", "griffin_top1"]  # stage 1 copied, not retrained
    assert (ours / "stage-1/head.safetensors").read_bytes() == (theirs / "stage-1/head.safetensors").read_bytes()
    assert (ours / "stage-2/head.safetensors").read_bytes() != (theirs / "stage-2/head.safetensors").read_bytes()
    history, source = (json.loads((d / "history.json").read_text()) for d in (ours, theirs))
    assert history["1"] == source["1"] and history["2"] != source["2"] and sorted(history) == ["1", "2", "3"]
    # another stage-1 learning rate: nothing to share, stage 1 is trained
    other = HeadPipeline(heads_cfg(tmp_path, "head.name=griffin_lr", "stage=train", "train_stage=1",
                                   "head.train.stages=[{passes:1,epochs:2,lr:1e-3},{passes:2,epochs:1,lr:1e-3}]"))
    other.run("train")
    assert (other.head_dir / "stage-1/head.safetensors").read_bytes() != \
        (theirs / "stage-1/head.safetensors").read_bytes()


def test_every_training_knob_is_in_the_yaml_and_one_at_its_default_names_the_same_head(tmp_path):
    base = HeadPipeline(heads_cfg(tmp_path))
    assert set(base.head_cfg["train"]) == {f.name for f in fields(TrainSettings)}  # overridden without '+'
    changed = HeadPipeline(heads_cfg(tmp_path, "head.train.ce_weight=1.0", "head.train.betas=[0.9,0.99]"))
    assert changed.settings.ce_weight == 1.0 and changed.settings.betas == (0.9, 0.99)
    assert changed.train_identity()["train"]["ce_weight"] == 1.0 and changed.train_identity() != base.train_identity()
    operational = HeadPipeline(heads_cfg(tmp_path, "head.train.threads=1", "head.train.checkpoint_seconds=5"))
    assert operational.train_identity() == base.train_identity()  # how a run goes is not what it trains
    # a train.json from before the knobs were in the YAML holds only the keys the YAML had: the same head
    older = dict(base.head_cfg["train"])
    for key in ("ce_weight", "feature_weight", "topk_loss_k", "clip_value", "betas", "checkpoint_seconds", "threads"):
        older.pop(key)
    assert comparable({**base.train_identity(), "train": older}) == base.train_identity()
    assert comparable({**base.train_identity(), "train": {**older, "ce_weight": 1.0}}) != base.train_identity()
    unreadable = {**base.train_identity(), "train": {**older, "no_such_knob": 1}}
    assert comparable(unreadable) == unreadable != base.train_identity()


def test_a_stage_depends_on_alignment_settings_only_once_a_stage_has_two_passes():
    identity = {"head": {"kind": "griffin"}, "data": "data-1", "train": {
        "align_top_k": 3, "topk_loss_weight": 0.5, "lr_note": 1,
        "stages": [{"passes": 1, "epochs": 2, "lr": 5e-4}, {"passes": 2, "epochs": 1, "lr": 2e-4}]}}
    top5 = {**identity, "train": {**identity["train"], "align_top_k": 5}}
    assert stage_identity(identity, 1) == stage_identity(top5, 1)
    assert stage_identity(identity, 2) != stage_identity(top5, 2)
    assert stage_identity({**identity, "data": "data-2"}, 1) != stage_identity(identity, 1)
    assert stage_identity({**identity, "head": {"kind": "eagle"}}, 1) != stage_identity(identity, 1)
    longer = {**identity, "train": {**identity["train"], "stages": identity["train"]["stages"] + [
        {"passes": 3, "epochs": 1, "lr": 2e-4}]}}
    assert stage_identity(longer, 2) == stage_identity(identity, 2)  # later stages do not matter
    first_two_passes = {**identity, "train": {**identity["train"], "stages": [{"passes": 2, "epochs": 2, "lr": 5e-4}]}}
    assert stage_identity(first_two_passes, 1) != stage_identity({**first_two_passes, "train": {
        **first_two_passes["train"], "align_top_k": 5}}, 1)


def test_training_flushes_denormals_and_restores_the_setting():
    tiny = torch.tensor([1e-39])  # a denormal float32
    assert float(tiny * 1.0) > 0
    with flushed_denormals():
        with flushed_denormals():
            assert float(tiny * 1.0) == 0.0
        assert float(tiny * 1.0) == 0.0  # only the outermost context restores
    assert float(tiny * 1.0) > 0


# -- Medusa / Hydra heads on the same pipeline -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_medusa_training_lowers_the_loss_of_every_head(tmp_path, kind):
    from specbench.models.heads.medusa import MedusaConfig, MedusaHeads
    from specbench.training.heads.medusa import medusa_batches, medusa_loss, train_medusa_stage

    sequences = tiny_data(tmp_path / "data")
    heads = MedusaHeads(MedusaConfig.for_target(PAIR.target.config, kind, heads=3)).to(PAIR.device)
    parts = TargetParts.of(PAIR.target, None)
    s = settings(stages=[Stage(1, 15, 3e-3)], batch_tokens=64)
    plan = medusa_batches(sequences, s, 3, seed=0)
    assert all(len(b["h"]) <= 64 for b in plan) and plan[0]["ahead"].shape[1] == 4

    def per_head():
        with torch.no_grad():
            stats = [medusa_loss(heads, parts, b, 1.0)[1] for b in plan]
        return [sum(s[k][0] for s in stats) / sum(s[k][1] for s in stats) for k in range(3)]
    before = sum(float(medusa_loss(heads, parts, b, 0.8)[0].detach()) for b in plan)
    top1_before = per_head()
    history = train_medusa_stage(heads, parts, s, s.stages[0], 1, sequences, 0.8, log=lambda m: None)
    after = sum(float(medusa_loss(heads, parts, b, 0.8)[0].detach()) for b in plan)
    assert after < 0.9 * before and len(history) == len(plan) * 15
    assert all(a > b for a, b in zip(per_head(), top1_before))  # every head learns its token k+1 ahead


def test_medusa_batches_pair_h_t_with_the_tokens_ahead():
    from specbench.training.heads.medusa import medusa_batches

    seq = {"ids": torch.tensor([10, 11, 12, 13, 14]), "start": 3, "hidden": torch.arange(5.0)[:, None].repeat(1, 2)}
    (batch,) = medusa_batches([seq], settings(batch_tokens=100), 2, seed=0)
    rows = sorted(zip(batch["h"][:, 0].tolist(), batch["ahead"].tolist(), batch["answer"].tolist()))
    # t = 1, 2 (head 1's token x_{t+2} is an answer token, from position 3 on, and exists)
    assert rows == [(1.0, [12, 13, 14], [False, True, True]), (2.0, [13, 14, -1], [True, True, False])]


def medusa_cfg(tmp_path, kind, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="heads", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", f"data.path={sharegpt_file(tmp_path / 'sg.json', 14)}",
            "data.prompts=10", "data.max_new_tokens=20", "data.batch_size=4", "data.exclude=[]", f"head={kind}",
            "head.train.batch_tokens=64", "head.train.max_length=64", f"paths.root={tmp_path / 'runs'}", *overrides])


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_pipeline_trains_medusa_heads_then_the_method_decodes_with_them(tmp_path, kind):
    cfg = medusa_cfg(tmp_path, kind, "head.heads=3", "head.train.stages=[{passes:1,epochs:3,lr:3e-3}]")
    with pytest.raises(ConfigError, match=r"^head\.train\.stages: medusa heads train with one pass per step"):
        HeadPipeline(medusa_cfg(tmp_path, "medusa", "head.train.stages=[{passes:2,epochs:1,lr:1e-3}]"))
    with pytest.raises(ConfigError, match=r"^head\.heads: "):
        HeadPipeline(medusa_cfg(tmp_path, "hydra", "head.heads=0"))
    pipeline = HeadPipeline(cfg)
    pipeline.run("all")
    head_dir = tmp_path / "runs" / "heads" / "tiny-llama" / kind
    meta = json.loads((head_dir / "head.json").read_text())
    assert meta["config"]["kind"] == kind and meta["config"]["heads"] == 3 and meta["provenance"]["stage"] == 1
    evaluation = json.loads((head_dir / "evaluation.json").read_text())
    assert len(evaluation["heads"]) == 3 and evaluation["expected_chain_tau"] >= 1
    if kind == "hydra":
        from specbench.methods.medusa import MedusaMethod
        from specbench.methods.greedy import Greedy
        method = MedusaMethod(PAIR, "hydra", kind="hydra", head=str(head_dir), depth=3)
        prompt = PAIR.encode("prompt 3: say something about 21")
        assert method.generate(prompt, 16, set()).tokens == Greedy(PAIR, "g").generate(prompt, 16, set()).tokens
        return
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        run_cfg = compose(config_name="config", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", "method=medusa", "method.depth=3",
            f"paths.root={tmp_path / 'runs'}", "data=gsm8k", "data.limit=2", "data.max_new_tokens=12",
            "runner.warmup=0", "runner.progress=false"])
    summary = benchmark.run(run_cfg)
    assert summary["identical"] == summary["compared"] == 2
    record = json.loads(next((tmp_path / "runs" / "records").rglob("*medusa*.jsonl")).read_text().splitlines()[0])
    assert record["config"]["method"]["head_sha256"] == meta["sha256"]


def test_heads_train_on_the_transformers_backend_whatever_auto_would_pick(tmp_path):
    """A head reads the target's hidden states: ``model.backend=auto`` (llama.cpp for a GGUF pair on a CPU) means
    transformers here, with the same data as an explicit transformers; llama.cpp is refused before any load."""
    def embedded(*overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose(config_name="heads", overrides=["model=embedded", f"paths.root={tmp_path / 'runs'}",
                                                           *overrides])

    auto = HeadPipeline(embedded("model.backend=auto"))
    assert auto.model_cfg.backend == "transformers"
    assert auto.data_identity() == HeadPipeline(embedded("model.backend=transformers")).data_identity()
    with pytest.raises(ConfigError, match="model.backend.*only the transformers backend.*'llamacpp'"):
        HeadPipeline(embedded("model.backend=llamacpp"))

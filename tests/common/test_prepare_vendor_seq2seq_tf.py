"""``zoo prepare vendor_t5 --framework tf`` and ``vendor_transformer --framework tf``: the last line names the
keys the vendor's TF T5 and Transformer readers take (data_dir and vocab_file; src/tgt_data_dir as glob
patterns), pointing at the files the PyTorch layout already holds.

The keys are read back as the vendor's TF readers use them, written here from their contract:
T5 lists ``data_dir/*.txt``; the Transformer globs each pattern, sorts the matches and zips the two
sides' lines."""

import glob
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--max_documents", "12", "--vocab_size", "300", "--num_files", "2", "--num_eval_files", "1"]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "datasets" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(out: str) -> dict[str, str]:
    return dict(token.split("=", 1) for token in out.strip().splitlines()[-1].split())


def test_t5_tf_keys_name_the_text_files_and_the_vocab(tmp_path, capsys):
    out = tmp_path / "d"
    assert _script("prepare_vendor_t5").main(["--output_dir", str(out), "--framework", "tf", *SMALL]) == 0
    keys = _keys(capsys.readouterr().out)
    assert set(keys) == {"train_input.data_dir", "eval_input.data_dir", "vocab_file"}
    assert Path(keys["vocab_file"]).read_text().splitlines()[:4] == ["<pad>", "</s>", "<unk>", "<s>"]
    for split, files in (("train", 2), ("eval", 1)):
        texts = sorted(glob.glob(str(Path(keys[f"{split}_input.data_dir"]) / "*.txt")))
        assert len(texts) == files and all(Path(t).read_text().strip() for t in texts)


def test_transformer_tf_keys_are_globs_whose_sorted_files_pair_line_by_line(tmp_path, capsys):
    out = tmp_path / "d"
    assert _script("prepare_vendor_transformer").main(["--output_dir", str(out), "--framework", "tf", *SMALL]) == 0
    keys = _keys(capsys.readouterr().out)
    assert set(keys) == {"train_input.src_data_dir", "train_input.tgt_data_dir", "eval_input.src_data_dir",
                         "eval_input.tgt_data_dir", "src_vocab_file", "tgt_vocab_file"}
    vocab = Path(keys["src_vocab_file"]).read_text().splitlines()
    assert keys["tgt_vocab_file"] == keys["src_vocab_file"] and {"<pad>", "<s>", "</s>", "<unk>"} <= set(vocab)
    for split, files in (("train", 2), ("eval", 1)):
        sources = sorted(glob.glob(keys[f"{split}_input.src_data_dir"]))
        targets = sorted(glob.glob(keys[f"{split}_input.tgt_data_dir"]))
        assert len(sources) == len(targets) == files  # meta.dat is not matched
        for src, tgt in zip(sources, targets):
            assert Path(src).stem == Path(tgt).stem
            pairs = list(zip(Path(src).read_text().splitlines(), Path(tgt).read_text().splitlines(), strict=True))
            assert pairs and all(s.split() and t.split() for s, t in pairs)
            assert {p for s, t in pairs for p in s.split() + t.split()} <= set(vocab)


def test_the_pytorch_keys_stay_the_default(tmp_path, capsys):
    assert _script("prepare_vendor_t5").main(["--output_dir", str(tmp_path / "d"), *SMALL]) == 0
    assert "train_input.src_data_dir" in _keys(capsys.readouterr().out)

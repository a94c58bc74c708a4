"""The work of ``datasets/prepare_bert.py``: corpus -> WordPiece ids -> sharded MLM + NSP files.

Output folder layout (N = num_shards)::

    vocab.txt                           the WordPiece vocab the ids refer to
    manifest.json                       the settings and each complete shard's example count
    train-0000K-of-0000N.tfrecord       tf.train.Example records (TensorFlow side)
    train-0000K-of-0000N.hdf5           the same examples, one dataset per field (PyTorch side)
    eval-00000-of-00001.{tfrecord,hdf5} examples of the held-out documents

Restartable: each file is written to a temporary name and renamed into place, and a
shard enters manifest.json only once all its files are complete. A rerun with the same
settings skips every shard whose files are there and hold the count manifest.json
records, and remakes the others. A rerun with other settings stops, naming the first
setting that differs, instead of mixing two kinds of examples in one folder.
"""

import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

from common.data.text.corpus import corpus_fingerprint, default_corpus, read_corpus
from common.data.text.pretraining import (
    MaskingConfig, SpecialIds, count_hdf5, make_shard, shard_seed, to_arrays, write_hdf5,
)
from common.data.text.tokenizer import (
    CLS, MASK, SEP, read_bert_tokenizer, train_wordpiece, vocab_in_id_order, write_vocab_txt,
)
from common.errors import UserError

FORMATS = ("tfrecord", "hdf5")
MIN_VOCAB_SIZE = 64  # the five special tokens and room for an alphabet


def _writer_and_counter(fmt: str):
    if fmt == "hdf5":
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise UserError("--formats hdf5 needs h5py (pip install h5py)") from None
        return write_hdf5, count_hdf5
    try:
        from common.data.text.tfrecord import count_tfrecord, write_tfrecord
    except ImportError:
        raise UserError("--formats tfrecord needs tensorflow; on a PyTorch-only install pass --formats hdf5") from None
    return write_tfrecord, count_tfrecord


class _Progress:
    """tqdm where it is installed, otherwise a line at every tenth of the work."""

    def __init__(self, total: int, desc: str):
        self.total, self.done, self.tenths, self.desc = total, 0, 0, desc
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="doc", file=sys.stderr, leave=False)
        except ImportError:
            self.bar = None

    def __call__(self, n: int):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.done * 10 >= (self.tenths + 1) * self.total:
            print(f"{self.desc}: {self.done:,}/{self.total:,} documents", file=sys.stderr, flush=True)
            self.tenths = self.done * 10 // self.total

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _atomic_write_json(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


@dataclasses.dataclass
class ShardResult:
    name: str
    examples: int
    files: list[Path]
    skipped: bool


def prepare_bert(
    output_dir,
    inputs=(),
    vocab_file=None,
    vocab_size: int = 8192,
    do_lower_case: bool = True,
    masking: MaskingConfig = MaskingConfig(),
    seed: int = 12345,
    num_shards: int = 4,
    eval_percent: float = 10.0,
    formats=FORMATS,
    field: str = "text",
    log=print,
) -> list[ShardResult]:
    """Write the shards (see the module docstring); returns one ShardResult per shard."""
    masking.validate()
    formats = tuple(formats)
    for fmt in formats:
        if fmt not in FORMATS:
            raise UserError(f"--formats: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if not formats:
        raise UserError("--formats: give at least one format")
    if num_shards < 1:
        raise UserError(f"num_shards {num_shards}: must be at least 1")
    if not vocab_file and vocab_size < MIN_VOCAB_SIZE:
        raise UserError(f"vocab_size {vocab_size}: must be at least {MIN_VOCAB_SIZE}")
    if not 0.0 <= eval_percent < 100.0:
        raise UserError(f"eval_percent {eval_percent}: must be in [0, 100)")
    io = {fmt: _writer_and_counter(fmt) for fmt in formats}  # fail on a missing library before any work

    output_dir = Path(output_dir)
    documents = read_corpus(inputs, field) if inputs else default_corpus()
    source = ", ".join(map(str, inputs)) if inputs else "the default corpus (pydoc_data topics)"

    if vocab_file:
        tokenizer = read_bert_tokenizer(vocab_file, do_lower_case)
    else:
        tokenizer = train_wordpiece(documents, vocab_size, do_lower_case)
    vocab = vocab_in_id_order(tokenizer)
    ids = SpecialIds(cls=tokenizer.token_to_id(CLS), sep=tokenizer.token_to_id(SEP),
                     mask=tokenizer.token_to_id(MASK), vocab_size=len(vocab),
                     continuation=frozenset(i for i, t in enumerate(vocab) if t.startswith("##")))

    sentences = [s for d in documents for s in d]
    encoded = iter(e.ids for e in tokenizer.encode_batch(sentences, add_special_tokens=False))
    token_documents = [[ids_ for ids_ in (next(encoded) for _ in d) if ids_] for d in documents]
    token_documents = [d for d in token_documents if d]
    if not token_documents:
        raise UserError(f"{source}: no sentence has a token after tokenization")
    random.Random(seed).shuffle(token_documents)  # as Google's all_documents

    num_eval = round(len(token_documents) * eval_percent / 100)
    if eval_percent > 0:
        num_eval = max(1, num_eval)
    splits = {"train": (token_documents[num_eval:], num_shards), "eval": (token_documents[:num_eval], 1)}
    for split, (docs, shards) in splits.items():
        if (docs or split == "train") and len(docs) < shards:
            raise UserError(f"{source}: {len(docs)} {split} documents cannot fill {shards} shard(s); "
                            f"lower --num_shards or --eval_percent, or give more documents")

    settings = {
        "source": source,
        "corpus_fingerprint": corpus_fingerprint(documents),
        "vocab_sha256": hashlib.sha256("\n".join(vocab).encode()).hexdigest()[:16],
        "vocab_size": len(vocab),
        "do_lower_case": do_lower_case,
        **dataclasses.asdict(masking),
        "seed": seed,
        "num_shards": num_shards,
        "eval_percent": eval_percent,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = output_dir / "manifest.json"
    manifest = {"settings": settings, "shards": {}}
    if manifest_path.exists():
        try:
            previous = json.loads(manifest_path.read_text())
            old_settings, old_shards = previous["settings"], dict(previous["shards"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{manifest_path}: unreadable; remove it (and the shards) to start over") from None
        for key, value in settings.items():
            if old_settings.get(key) != value:
                raise UserError(f"{output_dir}: holds examples made with {key} = {old_settings.get(key)!r}, "
                                f"not {value!r}; use another --output_dir or empty this one")
        manifest["shards"] = old_shards
    vocab_path = output_dir / "vocab.txt"
    write_vocab_txt(tokenizer, vocab_path)

    log(f"{source}: {len(documents):,} documents, {len(sentences):,} sentences; vocab {len(vocab):,} -> {vocab_path}")
    results = []
    started = time.perf_counter()
    for split, (docs, shards) in splits.items():
        for k in range(shards if docs else 0):
            name = f"{split}-{k:05d}-of-{shards:05d}"
            files = [output_dir / f"{name}.{fmt}" for fmt in formats]
            expected = manifest["shards"].get(name)
            if expected is not None and all(f.exists() for f in files):
                try:
                    complete = all(io[fmt][1](f) == expected for fmt, f in zip(formats, files))
                except UserError:
                    complete = False
                if complete:
                    results.append(ShardResult(name, expected, files, skipped=True))
                    log(f"{name}: complete ({expected:,} examples), skipped")
                    continue
            manifest["shards"].pop(name, None)
            _atomic_write_json(manifest, manifest_path)
            shard_docs = list(range(k, len(docs), shards))
            progress = _Progress(len(shard_docs) * masking.dupe_factor, name)
            instances = make_shard(docs, shard_docs, masking, ids, shard_seed(seed, split, k), progress)
            progress.close()
            arrays = to_arrays(instances, masking)
            for fmt, f in zip(formats, files):
                tmp = f.with_name(f.name + ".tmp")
                io[fmt][0](arrays, tmp)
                os.replace(tmp, f)
            manifest["shards"][name] = len(instances)
            _atomic_write_json(manifest, manifest_path)
            results.append(ShardResult(name, len(instances), files, skipped=False))
            sizes = ", ".join(f"{f.name} {f.stat().st_size / 1e6:.2f} MB" for f in files)
            log(f"{name}: {len(instances):,} examples -> {sizes}")
    made = sum(r.examples for r in results if not r.skipped)
    seconds = time.perf_counter() - started
    log(f"{sum(r.examples for r in results):,} examples in {output_dir} ({made:,} made in {seconds:.1f} s"
        + (f", {made / seconds:,.0f} examples/s" if made and seconds > 0 else "") + ")")
    return results

"""BERT pretraining examples (masked LM + next sentence), as Google's create_pretraining_data.

The algorithm is ``create_pretraining_data.py`` of google-research/bert (Apache-2.0),
ported to token ids, with the same random draws in the same order from Python's
``random.Random``:

- each document is cut into chunks of whole sentences of about ``max_seq_length - 3``
  tokens (with probability ``short_seq_prob`` a shorter target, uniform in
  ``2..max_seq_length - 3``, so that the model also sees short sequences);
- a chunk's first ``a_end`` sentences are segment A; segment B is the rest of the chunk
  (label 0, "is next") or, half the time or when the chunk is one sentence, sentences from
  a random other document (label 1, "random next"), the unused sentences being put back;
- the pair is truncated to fit, a token at a time from the front or the back of the
  longer segment, and laid out as ``[CLS] A [SEP] B [SEP]``;
- ``min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)))`` positions other
  than [CLS]/[SEP] are masked: each is replaced by [MASK] 80% of the time, by a random
  vocabulary token 10%, kept 10%. With ``whole_word_mask`` (the option Google added
  later, ``--do_whole_word_mask``) a word's "##" pieces are masked together with it, each
  piece still drawing its own 80/10/10.

One difference, for restartable shards: Google's script builds every instance, shuffles
them all and writes them round-robin. Here the documents (shuffled once) are dealt to the
shards, and each shard builds the instances of its own documents (``dupe_factor`` times,
drawing from the whole corpus for random-next B segments) with its own generator seeded
from (seed, split, shard), then shuffles them. A shard can so be made, or remade, alone.

The arrays (``FEATURES``) carry the names of Google's TFRecords; both writers, TFRecord
(``common.data.text.tfrecord``) and HDF5 (here), take the same arrays.
"""

import dataclasses
import random

import numpy as np

from common.data.text.shards import read_hdf5_datasets
from common.errors import UserError

MIN_SEQ_LENGTH = 8  # [CLS] a [SEP] b [SEP] and room to mask
MAX_SEQ_LENGTH = 512  # BERT's position embeddings stop here

# name -> (dtype, length in units of: "seq" max_seq_length, "pred" max_predictions_per_seq, 1)
FEATURES = {
    "input_ids": ("int64", "seq"),
    "input_mask": ("int64", "seq"),
    "segment_ids": ("int64", "seq"),
    "masked_lm_positions": ("int64", "pred"),
    "masked_lm_ids": ("int64", "pred"),
    "masked_lm_weights": ("float32", "pred"),
    "next_sentence_labels": ("int64", 1),
}


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """The settings of Google's script, with its defaults except max_seq_length."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    whole_word_mask: bool = False  # mask all pieces of a word together (Google's later option)

    def validate(self) -> "MaskingConfig":
        if not MIN_SEQ_LENGTH <= self.max_seq_length <= MAX_SEQ_LENGTH:
            raise UserError(f"max_seq_length {self.max_seq_length}: must be in {MIN_SEQ_LENGTH}..{MAX_SEQ_LENGTH} "
                            f"(BERT's position embeddings stop at {MAX_SEQ_LENGTH})")
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length - 3:
            raise UserError(f"max_predictions_per_seq {self.max_predictions_per_seq}: must be in "
                            f"1..{self.max_seq_length - 3} (max_seq_length - 3)")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise UserError(f"masked_lm_prob {self.masked_lm_prob}: must be in (0, 1)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise UserError(f"short_seq_prob {self.short_seq_prob}: must be in [0, 1]")
        if self.dupe_factor < 1:
            raise UserError(f"dupe_factor {self.dupe_factor}: must be at least 1")
        return self

    def lengths(self) -> dict:
        return {"seq": self.max_seq_length, "pred": self.max_predictions_per_seq, 1: 1}


@dataclasses.dataclass
class Instance:
    """One example before padding: token ids, segments, masked positions and their labels."""

    tokens: list[int]
    segment_ids: list[int]
    is_random_next: bool
    masked_lm_positions: list[int]
    masked_lm_labels: list[int]


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    vocab_size: int  # random replacements draw from ids 0..vocab_size-1, as Google's vocab_words
    continuation: frozenset = frozenset()  # ids of "##" pieces, for whole-word masking


def _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _masked_lm_predictions(tokens, cfg: MaskingConfig, ids: SpecialIds, rng):
    # candidate words: one position each, or with whole-word masking a word's pieces together
    cand_indexes = []
    for i, t in enumerate(tokens):
        if t == ids.cls or t == ids.sep:
            continue
        if cfg.whole_word_mask and cand_indexes and t in ids.continuation:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)
    output_tokens = list(tokens)
    num_to_predict = min(cfg.max_predictions_per_seq, max(1, int(round(len(tokens) * cfg.masked_lm_prob))))
    masked = []  # (position, original id)
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue  # a word that does not fit whole is skipped, as in Google's script
        for index in index_set:
            if rng.random() < 0.8:
                replacement = ids.mask
            elif rng.random() < 0.5:
                replacement = tokens[index]
            else:
                replacement = rng.randint(0, ids.vocab_size - 1)
            output_tokens[index] = replacement
            masked.append((index, tokens[index]))
    masked.sort()
    return output_tokens, [p for p, _ in masked], [t for _, t in masked]


def instances_from_document(all_documents, document_index, cfg: MaskingConfig, ids: SpecialIds, rng):
    """Google's create_instances_from_document: the examples of one document."""
    document = all_documents[document_index]
    max_num_tokens = cfg.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances, current_chunk, current_length = [], [], 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
                tokens_a = [t for s in current_chunk[:a_end] for t in s]
                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(current_chunk) - a_end  # the unused sentences go back
                else:
                    is_random_next = False
                    tokens_b = [t for s in current_chunk[a_end:] for t in s]
                _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                # Google asserts both are non-empty, which holds when no sentence is empty (the
                # callers drop empty ones); an instance that would break it is left out
                if tokens_a and tokens_b:
                    tokens = [ids.cls] + tokens_a + [ids.sep] + tokens_b + [ids.sep]
                    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                    tokens, positions, labels = _masked_lm_predictions(tokens, cfg, ids, rng)
                    instances.append(Instance(tokens, segment_ids, is_random_next, positions, labels))
            current_chunk, current_length = [], 0
        i += 1
    return instances


def shard_seed(seed: int, split: str, shard: int) -> str:
    """The seed of one shard's generator (a string: random.Random hashes it with SHA-512)."""
    return f"{seed}/{split}/{shard}"


def make_shard(all_documents, shard_documents, cfg: MaskingConfig, ids: SpecialIds, seed: str, progress=None):
    """The instances of the documents ``shard_documents`` (indexes into ``all_documents``), shuffled."""
    rng = random.Random(seed)
    instances = []
    for _ in range(cfg.dupe_factor):
        for index in shard_documents:
            instances.extend(instances_from_document(all_documents, index, cfg, ids, rng))
            if progress:
                progress(1)
    rng.shuffle(instances)
    return instances


def to_arrays(instances: list[Instance], cfg: MaskingConfig) -> dict[str, np.ndarray]:
    """Padded arrays of ``FEATURES`` (zeros past the end; weight 0 on padded predictions)."""
    n, L, P = len(instances), cfg.max_seq_length, cfg.max_predictions_per_seq
    out = {name: np.zeros((n, cfg.lengths()[unit]), dtype=dtype) for name, (dtype, unit) in FEATURES.items()}
    for k, inst in enumerate(instances):
        t, m = len(inst.tokens), len(inst.masked_lm_positions)
        assert t <= L and m <= P
        out["input_ids"][k, :t] = inst.tokens
        out["input_mask"][k, :t] = 1
        out["segment_ids"][k, :t] = inst.segment_ids
        out["masked_lm_positions"][k, :m] = inst.masked_lm_positions
        out["masked_lm_ids"][k, :m] = inst.masked_lm_labels
        out["masked_lm_weights"][k, :m] = 1.0
        out["next_sentence_labels"][k, 0] = int(inst.is_random_next)
    return out


def check_arrays_schema(arrays: dict, path, max_seq_length=None, max_predictions_per_seq=None) -> tuple[int, int, int]:
    """(count, max_seq_length, max_predictions_per_seq) of a file's arrays, or UserError naming the field."""
    for name, (dtype, unit) in FEATURES.items():
        if name not in arrays:
            raise UserError(f"{path}: not a BERT pretraining file: field {name!r} is missing "
                            f"(expected {', '.join(FEATURES)})")
        a = arrays[name]
        kind = "f" if dtype.startswith("float") else "i"
        if a.dtype.kind not in (kind, "u" if kind == "i" else kind) or a.ndim != 2:
            raise UserError(f"{path}: field {name!r} is {a.dtype} of shape {a.shape}; expected 2-D {dtype}")
    n = arrays["input_ids"].shape[0]
    seq, pred = arrays["input_ids"].shape[1], arrays["masked_lm_positions"].shape[1]
    expected = {"seq": max_seq_length or seq, "pred": max_predictions_per_seq or pred, 1: 1}
    for name, (_, unit) in FEATURES.items():
        if arrays[name].shape != (n, expected[unit]):
            raise UserError(f"{path}: field {name!r} has shape {arrays[name].shape}; expected {(n, expected[unit])}")
    return n, expected["seq"], expected["pred"]


def write_hdf5(arrays: dict[str, np.ndarray], path) -> None:
    """One HDF5 file, a dataset per field (int32 ids, as NVIDIA's BERT HDF5 files; float32 weights)."""
    import h5py

    with h5py.File(path, "w") as f:
        for name, (dtype, _) in FEATURES.items():
            data = arrays[name].astype(np.int32 if dtype == "int64" else np.float32)
            # fletcher32: a checksum per chunk, so that a flipped bit is found on reading (gzip alone
            # lets some through as other numbers)
            f.create_dataset(name, data=data, compression="gzip", compression_opts=4, fletcher32=True)


def read_hdf5(path, max_seq_length=None, max_predictions_per_seq=None) -> dict[str, np.ndarray]:
    """The arrays of one HDF5 file, schema-checked; UserError naming the file and the field."""
    arrays = read_hdf5_datasets(path, FEATURES)
    check_arrays_schema(arrays, path, max_seq_length, max_predictions_per_seq)
    return arrays


def count_hdf5(path) -> int:
    return check_arrays_schema(read_hdf5(path), path)[0]

"""The vendor's nine PyTorch transformers folders (R1.6), and its TF ones as they come to run
here, and how each is run: one table.

Each entry names the folder (below ``modelzoo/transformers/pytorch/`` of a checkout; a TF
one below ``modelzoo/transformers/``, as ``tf/gpt2``), its params file, the ``zoo prepare vendor_*`` command that writes its data in the vendor's layout,
and the command-line overrides of a small first run, each with its reason. ``zoo port
vendor-check`` (vendor_check.py) runs them; ``zoo port migrate`` (migrate.py) ends its report
with them. Nothing here imports either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FAMILY = ("modelzoo", "transformers", "pytorch")  # where the PyTorch folders lie in a checkout
TF_FAMILY = ("modelzoo", "transformers")  # the TF folders' paths start with tf/
VISION_FAMILY = ("modelzoo",)  # a folder outside transformers/ is named by its path below modelzoo/: unet/tf

# what every folder's runs set: dropout and mixed precision off, so the CPU and the emulator compute alike
_SMALL_BERT = ("model.num_hidden_layers=1 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
               "model.max_position_embeddings=128 model.mixed_precision=false")
_SMALL_INPUT = ("train_input.batch_size=8 eval_input.batch_size=8 train_input.num_workers=1 "
                "eval_input.num_workers=1")
_NUM_WORKERS = ("size: one loader process where the configs ask for up to 8 (the loaders' persistent_workers: true "
                "needs one)")
_BERT_HALF = "the vendor's huggingface_common/modeling_bert.py returns this loss .half()"
_SEQ2SEQ_SMALL = ("model.encoder_num_hidden_layers=1 model.decoder_num_hidden_layers=1 model.d_model=64 "
                  "model.d_kv=32 model.num_heads=2 model.d_ff=128 model.mixed_precision=false")


@dataclass(frozen=True)
class Folder:
    """One folder of the vendor's zoo and how it is checked: ``overrides`` are (overrides, why) pairs."""

    path: str  # below modelzoo/transformers/pytorch/
    config: str  # the params file, relative to the folder
    # the data command ({python}, {out}: the data folder); None: the folder makes its own; (): none here yet
    data: tuple[str, ...] | None
    overrides: tuple[tuple[str, str], ...]
    loss_dtype: str = "float32"  # the dtype the folder's loss is returned in
    loss_dtype_why: str = ""
    # why the first losses cannot be compared (randomness no setting reaches): the row is then not passed
    uncomparable: str = ""
    family: tuple[str, ...] = FAMILY  # TF_FAMILY for the TF folders
    # (NAME=value, why) pairs set in the environment of each of its runs: what no params key reaches
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.path

    @property
    def framework(self) -> str:
        """pytorch or tf: a TF folder's run.py (the vendor's own) takes no overrides on its command line, so
        they go into a params file written for the run."""
        return "tf" if "tf" in self.path.split("/") else "pytorch"  # tf/gpt2, unet/tf

    def source(self, checkout: str) -> str:
        return os.path.join(checkout, *self.family, *self.path.split("/"))

    def override_args(self) -> list[str]:
        return [o for text, _ in self.overrides for o in text.split()]

    def environment(self) -> dict[str, str]:
        return dict(text.split("=", 1) for text, _ in self.env)


def _prepare(name: str, *extra: str) -> tuple[str, ...]:
    return ("{python}", "-m", "common.zoo_cli", "prepare", name, "--output_dir", "{out}", *extra)


_TF_GPT_DATA = _prepare("vendor_gpt2", "--max_seq_length", "128", "--format", "tfrecords")
_TF_SEQ2SEQ_HALF_MASK = ("as its config has it: its eval metrics multiply the per-token loss by a float16 mask "
                         "(build_eval_metric_ops), which TF refuses with a float32 loss")
_TF_SEQ2SEQ_HALF_LOSS = "with mixed precision the vendor's TF t5 and transformer compute their loss in float16"
# the model keys of the vendor's TF bert base pre-training configs, which a TF fine-tuning head's
# pretrain_params_path reads from the pre-training folder (not migrated with the head)
_BERT_BASE_PRETRAIN_KEYS = ("model.encoder_nonlinearity=gelu model.use_ffn_bias=true model.layer_norm_epsilon=1e-5 "
                            "model.use_position_embedding=true model.use_segment_embedding=true "
                            "model.position_embedding_type=learned model.share_embedding_weights=true "
                            "model.use_vsl=false")
_TF_SHUFFLE_SEED = ("train_input.shuffle_seed=1 eval_input.shuffle_seed=1",
                    "its config sets no shuffle seed, and its reader then shuffles unseeded: two CPU runs differ "
                    "from step 2")

# The nine folders, in the vendor's order. Sizes are small so that each run takes seconds; what is not size
# is given with its reason.
FOLDERS: dict[str, Folder] = {f.name: f for f in (
    Folder("bert", "configs/bert_base_msl128.yaml", _prepare("vendor_bert", "--max_seq_length", "128"), (
        (_SMALL_BERT + " model.dropout_rate=0.0 model.attention_dropout_rate=0.0", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    ), loss_dtype="float16", loss_dtype_why=_BERT_HALF),
    Folder("bert/fine_tuning/classifier", "configs/bert_base_classifier_sst2.yaml",
           _prepare("vendor_bert_classifier", "--task", "sst2"), (
        (_SMALL_BERT + " model.dropout_rate=0.0 model.attention_dropout_rate=0.0 model.task_dropout=0.0 "
         "train_input.max_sequence_length=128 eval_input.max_sequence_length=128", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    )),
    Folder("bert/fine_tuning/extractive_summarization", "configs/bert_base_summarization.yaml",
           _prepare("vendor_bert_summarization", "--max_sequence_length", "128"), (
        (_SMALL_BERT + " model.dropout_rate=0.0 model.attention_dropout_rate=0.0 "
         "train_input.max_sequence_length=128 eval_input.max_sequence_length=128", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    ), loss_dtype="float16", loss_dtype_why=_BERT_HALF),
    Folder("bert/fine_tuning/qa", "configs/bert_base_squad.yaml",
           _prepare("vendor_bert_qa", "--max_sequence_length", "128"), (
        (_SMALL_BERT + " model.dropout_rate=0.0 model.attention_dropout_rate=0.0 "
         "train_input.max_sequence_length=128 eval_input.max_sequence_length=128", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    )),
    Folder("bert/fine_tuning/token_classifier", "configs/bert_base_ner_bc5cdr_chem.yaml",
           _prepare("vendor_bert_ner", "--max_sequence_length", "128"), (
        (_SMALL_BERT + " model.encoder_output_dropout_rate=0.0 "
         "train_input.max_sequence_length=128 eval_input.max_sequence_length=128", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
        ("train_input.shuffle_seed=1 eval_input.shuffle_seed=1",
         "its config sets no shuffle seed, and its loader then shuffles unseeded: two CPU runs differ"),
        ("runconfig.disable_dropout=true",
         "its model.py builds BertConfig without dropout rates, so the encoder's dropout is transformers' 0.1 "
         "whatever the config says: the switch sets every dropout to 0 on both runs"),
    ), loss_dtype="float16", loss_dtype_why=_BERT_HALF),
    Folder("gpt2", "configs/params_gpt2_small.yaml", _prepare("vendor_gpt2", "--max_seq_length", "128"), (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    ), loss_dtype="float16", loss_dtype_why="the vendor's GPT2LMHeadModel returns its loss .half()"),
    Folder("t5", "configs/t5_small.yaml", _prepare("vendor_t5"), (
        (_SEQ2SEQ_SMALL + " model.dropout_rate=0.0 train_input.src_max_sequence_length=128 "
         "eval_input.src_max_sequence_length=128 train_input.tgt_max_sequence_length=32 "
         "eval_input.tgt_max_sequence_length=32", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    )),
    Folder("transformer", "configs/transformer_base.yaml", _prepare("vendor_transformer"), (
        (_SEQ2SEQ_SMALL + " model.dropout_rate=0.0 train_input.src_max_sequence_length=64 "
         "eval_input.src_max_sequence_length=64 train_input.tgt_max_sequence_length=64 "
         "eval_input.tgt_max_sequence_length=64", "small size, dropout off"),
        (_SMALL_INPUT, _NUM_WORKERS),
    )),
    Folder("layers_api_demo", "configs/params.yaml", None, (
        ("model.num_hidden_layers=1 model.hidden_size=32 model.embedding_size=32 model.num_heads=2 "
         "model.mixed_precision=false model.dropout=0.0 train_input.batch_size=8 eval_input.batch_size=8 "
         "train_input.num_samples=256 eval_input.num_samples=64", "small size, dropout off"),
    )),
    # the TF folders that run here so far
    Folder("tf/gpt2", "configs/params_gpt2_small.yaml", _TF_GPT_DATA, (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0", "small size, dropout off"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("tf/gpt3", "configs/params_gpt3_xl_ws.yaml", _TF_GPT_DATA, (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0", "small size, dropout off"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("tf/gptj", "configs/params_gptj.yaml", _TF_GPT_DATA, (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 model.rotary_dim=16 "
         "model.max_position_embeddings=128 model.mixed_precision=false", "small size"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("tf/t5", "configs/params_small.yaml", _prepare("vendor_t5", "--framework", "tf"), (
        ("model.encoder_num_hidden_layers=1 model.decoder_num_hidden_layers=1 model.d_model=64 model.d_kv=32 "
         "model.num_heads=2 model.d_ff=128 model.dropout_rate=0.0 train_input.src_max_sequence_length=128 "
         "eval_input.src_max_sequence_length=128 train_input.tgt_max_sequence_length=32 "
         "eval_input.tgt_max_sequence_length=32", "small size, dropout off"),
        ("model.mixed_precision=true", _TF_SEQ2SEQ_HALF_MASK),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        ("train_input.shuffle_seed=1 eval_input.shuffle_seed=1",
         "its config's seed: 10 is read by nothing; the reader shuffles files, chunks and examples by shuffle_seed, "
         "unseeded without it"),
    ), loss_dtype="float16", loss_dtype_why=_TF_SEQ2SEQ_HALF_LOSS, family=TF_FAMILY, env=(
        ("TF_DETERMINISTIC_OPS=1",
         "its reader draws each document's chunk and noise spans with stateful random ops inside parallel maps "
         "(num_parallel_calls AUTOTUNE), so which example gets which draw follows the threads' timing: two CPU runs "
         "differ from step 2, and the emulator's first batch is not the CPU's (in float32: first loss 8.71991 against "
         "8.72545). TF's op determinism runs such a map one element at a time; no params key reaches it"),)),
    Folder("tf/transformer", "configs/params_base.yaml", _prepare("vendor_transformer", "--framework", "tf"), (
        ("model.encoder_num_hidden_layers=1 model.decoder_num_hidden_layers=1 model.hidden_size=64 model.num_heads=2 "
         "model.filter_size=128 model.dropout_rate=0.0 model.attention_dropout_rate=0.0 "
         "train_input.src_max_sequence_length=64 eval_input.src_max_sequence_length=64 "
         "train_input.tgt_max_sequence_length=64 eval_input.tgt_max_sequence_length=64", "small size, dropout off"),
        ("model.mixed_precision=true", _TF_SEQ2SEQ_HALF_MASK),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
    ), loss_dtype="float16", loss_dtype_why=_TF_SEQ2SEQ_HALF_LOSS, family=TF_FAMILY),
    Folder("tf/bert", "configs/params_bert_base_msl128.yaml",
           _prepare("vendor_bert", "--format", "tfrecords", "--max_seq_length", "128"), (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0", "small size, dropout off"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        ("train_input.buckets=1", "its config's bucket boundaries are for batch 256 (its comment says so); one "
                                  "bucket batches in the reader's order"),
        ("model.use_vsl=false", "variable sequence length is for the vendor's system: with it the reader pads "
                                "masked_lm_ids with -1, which TF's sparse cross entropy refuses on the CPU"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("tf/bert/fine_tuning/token_classifier", "configs/params_bert_base_ner_bc5cdr-chem.yaml",
           _prepare("vendor_bert_ner", "--format", "tfrecords", "--max_sequence_length", "128"), (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0 model.encoder_output_dropout_rate=0.0", "small size, dropout off"),
        ("model.pretrain_params_path=configs/params_bert_base_ner_bc5cdr-chem.yaml " + _BERT_BASE_PRETRAIN_KEYS,
         "its pretrain_params_path names the pre-training folder's config (../../configs/), which is not migrated "
         "with it: pointed at the folder's own config, and that config's model keys (params_bert_base_msl128's) "
         "given here"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("tf/bert/fine_tuning/extractive_summarization", "configs/params_bertsum_base.yaml",
           _prepare("vendor_bert_summarization", "--format", "tfrecords", "--max_sequence_length", "128"), (
        ("model.num_hidden_layers=2 model.hidden_size=64 model.num_heads=2 model.filter_size=128 "
         "model.max_position_embeddings=128 model.mixed_precision=false model.dropout_rate=0.0 "
         "model.attention_dropout_rate=0.0", "small size, dropout off"),
        ("model.pretrain_params_path=configs/params_bertsum_base.yaml " + _BERT_BASE_PRETRAIN_KEYS,
         "its pretrain_params_path names the pre-training folder's config (../../configs/), which is not migrated "
         "with it: pointed at the folder's own config, and that config's model keys (params_bert_base_msl512's) "
         "given here"),
        ("train_input.batch_size=8 eval_input.batch_size=8", "size"),
        _TF_SHUFFLE_SEED,
    ), family=TF_FAMILY),
    Folder("unet/tf", "configs/params_dagm_tfrecords.yaml", _prepare("vendor_unet"), (
        ("model.encoder_filters=[8,16,32,64] model.decoder_filters=[32,16,8] train_input.train_batch_size=8 "
         "train_input.eval_batch_size=8", "small size (the image size comes from the data command: 32x32)"),
        ("model.mixed_precision=false", "its reader casts the images and masks to float16 with it; the CPU and the "
                                        "emulator compute alike in float32"),
        ("model.data_format=channels_last", "its config's own comment: channels_last for running on CPU"),
        ("train_input.augment_data=false train_input.seed=1",
         "its flips and rotations are random draws inside a parallel map, seeded only by train_input.seed, which "
         "its config leaves unset (its shuffle too): augmentation off, and a seed for the shuffle"),
    ), family=VISION_FAMILY),
)}


def folder_of(checkout: str, src: str) -> Folder | None:
    """The entry of FOLDERS for the folder ``src`` of the vendor's ``checkout``, if it has one."""
    for folder in FOLDERS.values():
        if os.path.realpath(folder.source(checkout)) == os.path.realpath(src):
            return folder
    return None

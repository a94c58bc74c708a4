"""The vendor's config keys (Cerebras model zoo R1.6) that this zoo's strict params take: one table.

Every key that the vendor's R1.6 configs (transformers and fc_mnist, PyTorch and TF) set in
runconfig, optimizer, train_input or eval_input and that this zoo's schema
(common/params.py COMMON_DEFAULTS) does not hold under that name has one entry here, with its
type and a one-line reason:

    ignored    it configures the vendor's system or its runner and means nothing here: accepted
               (a value of the wrong type is an error naming its file:line), named once in the
               log with its file:line, and left out of the validated sections
    spelling   the vendor's name of one of this zoo's keys: read as that key
    honoured   a key of this zoo's schema now (COMMON_DEFAULTS), under the vendor's name

The model section is the model's own (its defaults decide); no model key is here. An input
key here is taken only where the model's defaults do not declare it. Any other unknown key
is refused as before, with the closest valid key suggested.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VendorKey:
    kind: str  # "ignored", "spelling" or "honoured"
    reason: str  # ignored: why; spelling: the zoo key it is; honoured: what it does here
    types: tuple[type, ...] = ()  # ignored keys: the types a value may have (honoured: the schema's)
    zoo_key: str | None = None  # spelling: the key it is read as, in the same section


def _ignored(reason: str, *types: type) -> VendorKey:
    return VendorKey("ignored", reason, types)


_SYSTEM = "it configures the vendor's system; --device picks cpu, gpu or emulator here"
_CLUSTER = "it configures the vendor's cluster"
_SUMMARIES = ("the vendor's optimizer summaries; the loss, learning rate and loss scale are always in "
              "model_dir/train's TensorBoard scalars here")

VENDOR_KEYS: dict[tuple[str, str], VendorKey] = {
    # --- runconfig: the vendor's system and runner ---------------------------------------
    ("runconfig", "cs_ip"): _ignored(_SYSTEM, str),
    ("runconfig", "multireplica"): _ignored(_SYSTEM, bool),
    ("runconfig", "num_wgt_servers"): _ignored(_SYSTEM, int),
    ("runconfig", "num_csx"): _ignored(_SYSTEM, int),
    ("runconfig", "appliance"): _ignored(_SYSTEM, bool),
    ("runconfig", "fabric_config_file"): _ignored(_SYSTEM, str),
    ("runconfig", "use_cs_grad_accum"): _ignored(_SYSTEM, bool),
    ("runconfig", "num_workers_per_csx"): _ignored(_SYSTEM, int),
    ("runconfig", "mgmt_address"): _ignored(_CLUSTER, str),
    ("runconfig", "credentials_path"): _ignored(_CLUSTER, str),
    ("runconfig", "mount_dirs"): _ignored(_CLUSTER, list, str),
    ("runconfig", "python_paths"): _ignored(_CLUSTER, list, str),
    ("runconfig", "volume_mount_path"): _ignored(_CLUSTER, str),
    ("runconfig", "dist_addr"): _ignored(_SYSTEM, str),
    ("runconfig", "dist_backend"): _ignored(_SYSTEM, str),
    ("runconfig", "init_method"): _ignored(_SYSTEM, str),
    ("runconfig", "enable_distributed"): _ignored(
        "the vendor's multi-worker TF run on its system; runconfig.train_distribute picks a tf.distribute "
        "strategy here, and torchrun launches PyTorch data parallel", bool),
    ("runconfig", "multiple_workers"): _ignored(
        "the vendor's TF run on several workers of its system (its gpt2's set_defaults adds it); "
        "runconfig.train_distribute picks a tf.distribute strategy here", bool),
    ("runconfig", "disable_standard_logs"): _ignored(
        "the vendor's Estimator's own step log (its set_defaults turns it off with gradient accumulation); the "
        "runner's log line comes every runconfig.log_steps here", bool),
    ("runconfig", "enable_gpu_optimizations"): _ignored(
        "the vendor's BERT picked GPU-friendly ops with it; a model here picks its own ops", bool),
    ("runconfig", "show_debug_metrics"): _ignored("the vendor's system's debug metrics", bool),
    ("runconfig", "log_step_count_steps"): _ignored(
        "the Estimator's steps/sec line; each log line every runconfig.log_steps gives the rate here", int),
    ("runconfig", "save_initial_checkpoint"): _ignored(
        "the vendor's runner saved a checkpoint before the first step; here the first one is at "
        "runconfig.checkpoint_steps (the weights at step 0 are the seed's)", bool),
    ("runconfig", "save_losses"): _ignored("the losses are in model_dir/train's TensorBoard scalars here", bool),
    ("runconfig", "mode"): _ignored("--mode sets the mode here", str),
    ("runconfig", "validate_only"): _ignored("--validate_only sets it here", bool),
    ("runconfig", "compile_only"): _ignored("--compile_only sets it here", bool),
    ("runconfig", "compile_dir"): _ignored("a compile writes into model_dir/compile here", str),
    ("runconfig", "logging"): _ignored("--verbose sets the log level here", str, int),
    ("runconfig", "streamer_logging"): _ignored("--verbose sets the log level here", str, int),
    ("runconfig", "throttle_secs"): _ignored("train_and_eval evaluates each checkpoint as it is saved here", int),
    ("runconfig", "is_pretrained_checkpoint"): _ignored("--checkpoint_path loads the weights it names here", bool),
    ("runconfig", "debug_args_path"): _ignored("it configures the vendor's compiler", str),
    # --- optimizer ------------------------------------------------------------------------
    ("optimizer", "weight_decay_rate"): VendorKey("spelling", "the weight decay", zoo_key="weight_decay"),
    ("optimizer", "use_nesterov"): VendorKey("spelling", "Nesterov momentum", zoo_key="nesterov"),
    ("optimizer", "beta_1"): VendorKey("spelling", "Adam's beta1 (the vendor's TF spelling)", zoo_key="beta1"),
    ("optimizer", "beta_2"): VendorKey("spelling", "Adam's beta2 (the vendor's TF spelling)", zoo_key="beta2"),
    ("optimizer", "use_bias_correction"): VendorKey(
        "spelling", "Adam's bias correction (the vendor's TF spelling)", zoo_key="correct_bias"),
    ("optimizer", "correct_bias"): VendorKey(
        "honoured", "adam and adamw divide by 1 - beta^step (true) or not (false, as the vendor's BERT)"),
    ("optimizer", "max_loss_scale"): VendorKey("honoured", "dynamic loss scaling never grows the scale beyond it"),
    ("optimizer", "disable_lr_steps_reset"): VendorKey(
        "honoured", "true: each schedule of a learning_rate list reads the global step, not the steps since it "
                    "began"),
    ("optimizer", "log_summaries"): _ignored(_SUMMARIES, bool),
    ("optimizer", "log_grads"): _ignored(_SUMMARIES, bool),
    ("optimizer", "log_hists"): _ignored(_SUMMARIES, bool),
    ("optimizer", "ws_summary"): _ignored("the vendor's weight-streaming summaries", bool),
    # --- the input sections (taken only where a model's defaults do not declare them) -----
    ("train_input", "use_multiple_workers"): _ignored("the vendor's input workers beside its system", bool),
    ("eval_input", "use_multiple_workers"): _ignored("the vendor's input workers beside its system", bool),
}

# the vendor's spellings, (section, vendor key) -> (section, zoo key)
SPELLINGS: dict[tuple[str, str], tuple[str, str]] = {
    key: (key[0], entry.zoo_key) for key, entry in VENDOR_KEYS.items() if entry.kind == "spelling"}
IGNORED: dict[tuple[str, str], VendorKey] = {key: e for key, e in VENDOR_KEYS.items() if e.kind == "ignored"}

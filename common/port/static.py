"""The static reader of ``zoo port check``: what the device will not take, found in the
source text without running it.

The reader first sorts the code into regions, then applies rule tables to each call:

    model   classes deriving from nn.Module, keras.Model/Layer or PyTorchBaseModel;
            model_fn and what it calls; functions that build a Keras model
    data    Dataset classes; input_fn, get_*_dataloader, collate and map functions;
            a zoo folder's data.py
    train   a loop that calls backward() or optimizer.step() (or a GradientTape's
            gradient), and a Keras model's train_step: the training step
    host    host_call's metric function: runs on the host, where anything goes

Rules about ops, dtypes, shapes and metrics apply to the regions where the device would
run them (an unsupported op in a data function is fine: the host runs it); rules about
data apply to every DataLoader and tf.data pipeline; reading the network is a finding
wherever it happens at run time. Each finding names the user's line and the change to
make. Where a rule cannot tell (a drop_last set from a variable), the reader says so in a
note rather than guessing. ``common.port.capture`` then builds the model where it can and
lets the device compiler confirm the model's ops, dtypes and shapes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from common.port.findings import Finding, Note
from common.port.source import NOT_LITERAL, Source, keyword, literal
from device.api import FRAMEWORK_OPTIMIZERS, dtype_suggestion, refused_op

# --- regions ------------------------------------------------------------------------------

# base classes that make a class model code (qualified as the reader names them)
MODEL_BASES = {"torch.nn.Module", "torch.nn.Sequential", "torch.nn.ModuleList", "keras.Model", "keras.Sequential",
               "keras.layers.Layer", "keras.Layer", "keras.models.Model", "keras.models.Sequential"}
MODEL_BASE_NAMES = {"PyTorchBaseModel"}  # the zoo's own, however it was imported
DATA_BASES = {"torch.utils.data.Dataset", "torch.utils.data.IterableDataset", "keras.utils.Sequence",
              "keras.utils.PyDataset"}
# function names that are data code wherever they are defined (the contract's and the usual ones)
DATA_FUNCTION = re.compile(r"(.*_)?input_fn|get_.*dataloader.*|.*_dataloader|.*collate.*|preprocess.*|"
                           r"(load|make|build|get)_.*(data|dataset|loader)s?")
# calls whose function argument runs in the input pipeline
MAPPING_CALLS = {".map", ".filter", ".flat_map", ".interleave", "tensorflow.data.Dataset.from_generator"}
# calls that read a dataset into numpy on the host (its batches never reach the model)
HOST_READERS = {"tensorflow_datasets.as_numpy", "tensorflow_datasets.as_dataframe"}
KERAS_BUILDERS = {"keras.Sequential", "keras.Model", "keras.Input", "keras.models.Sequential", "keras.models.Model",
                  "keras.layers.Input"}

# --- rule tables --------------------------------------------------------------------------

# Calls -> the framework op the capture records them as (an aten op for torch's, a TF op type for
# tensorflow's): whether the device takes it, and what to use instead, is the frontend's answer
# (device.api.refused_op), so that a frontend that learns to lower one ends the finding here too.
# A leading dot matches the method on any object (x.topk(2)); only names no Python list, dict or
# string has are listed that way, and those are torch's methods.
UNSUPPORTED_CALLS: dict[str, str] = {
    "torch.sort": "aten.sort.default",
    "torch.argsort": "aten.sort.default",
    ".argsort": "aten.sort.default",
    "torch.topk": "aten.topk.default",
    ".topk": "aten.topk.default",
    "torch.nonzero": "aten.nonzero.default",
    ".nonzero": "aten.nonzero.default",
    "torch.argwhere": "aten.nonzero.default",
    "torch.unique": "aten._unique2.default",
    ".unique": "aten._unique2.default",
    "torch.median": "aten.median.default",
    ".median": "aten.median.default",
    "torch.masked_select": "aten.masked_select.default",
    ".masked_select": "aten.masked_select.default",
    "torch.stft": "aten._fft_r2c.default",
    ".item": "aten.item.default",  # a value read on the host in the middle of the step
    ".tolist": "aten.item.default",
    ".numpy": "aten.item.default",
    "tensorflow.unique": "Unique",
    "tensorflow.sort": "Sort",
    "tensorflow.argsort": "Sort",
    "tensorflow.math.top_k": "TopKV2",
    "tensorflow.nn.top_k": "TopKV2",
    "tensorflow.py_function": "EagerPyFunc",
    "tensorflow.numpy_function": "PyFunc",
    "tensorflow.py_func": "PyFunc",
    "tensorflow.print": "PrintV2",
    "tensorflow.Print": "Print",
    "tensorflow.strings.to_hash_bucket_fast": "StringToHashBucketFast",
    "tensorflow.strings.to_hash_bucket_strong": "StringToHashBucketStrong",
}
UNSUPPORTED_PREFIXES = {"torch.fft.": "aten._fft_r2c.default", "tensorflow.signal.": "FFT",
                        "tensorflow.ragged.": "ragged"}  # ragged: many ops, none recorded as one; the reader's own
_RAGGED = ("ragged tensors have a row length per example; the device needs static shapes: pad to one "
           "length in the input pipeline")
# Layers the device takes in some forms only: layer -> (the argument that decides it, None: always;
# what it is; the form of the aten op the torch frontend declines, whose suggestion it gives through
# device.api.refused_op). torch.nn.Conv1d / Conv2d with groups, Keras Conv2D(groups), DepthwiseConv2D
# and SeparableConv2D run (conv2d's groups).
UNSUPPORTED_LAYERS: dict[str, tuple[str | None, str, str]] = {
    "torch.nn.ConvTranspose1d": (None, "transposed 1-d convolution", "transposed 1-d"),
    "torch.nn.ConvTranspose2d": ("groups", "grouped transposed convolution", "transposed groups"),
    "torch.nn.ConvTranspose3d": (None, "3-d convolution", "3-d"),
    "torch.nn.Conv3d": (None, "3-d convolution", "3-d"),
}
# Keras layers the reader cannot map onto a TF op the TF frontend refuses (Conv1DTranspose is
# written out in several TF ops, none of which is refused by type), so its own word stays
KERAS_UNSUPPORTED_LAYERS: dict[str, str] = {"keras.layers.Conv1DTranspose": "transposed 1-d convolution"}
_CONV_FIX = ("an ordinary convolution, or upsampling followed by one (keras.layers.UpSampling1D, then a "
             "Conv1D) in place of a transposed one")

# Optimizers the device runs: the framework classes its frontends read, and the runners' optimizer_type names
SUPPORTED_OPTIMIZERS = frozenset(name for names in FRAMEWORK_OPTIMIZERS.values() for name in names)
OPTIMIZER_MODULES = ("torch.optim.", "keras.optimizers.", "tensorflow.train.", "tensorflow.optimizers.")
_OPTIMIZER_FIX = ("optimizer.optimizer_type in params: sgd, momentum, adam or adamw (the runner builds it, "
                  "with optimizer.learning_rate, a number or a schedule)")

# The network at run time: call -> what it fetches. The device's workers are offline.
NETWORK_CALLS = {
    "keras.utils.get_file": "downloads a file",
    "urllib.request.urlopen": "reads a URL",
    "urllib.request.urlretrieve": "downloads a URL",
    "requests.get": "reads a URL",
    "requests.post": "reads a URL",
    "wget.download": "downloads a URL",
    "torch.hub.load": "downloads a model from torch.hub",
    "torch.hub.load_state_dict_from_url": "downloads weights",
    "torch.hub.download_url_to_file": "downloads a URL",
    "datasets.load_dataset": "downloads a data set from the Hugging Face hub",
    "gdown.download": "downloads a file",
}
_URL = re.compile(r"^(https?|ftp|gs|s3|hf)://")
# calls that read what a URL argument names (print or add_argument merely mention one)
_READER = re.compile(r"read_\w+|open|urlopen|urlretrieve|get|load\w*|fetch\w*|download\w*|\w*Dataset|get_file|"
                     r"from_\w+|\w*Folder")
_NETWORK_FIX = ("fetch it once onto local disk (zoo prepare, datasets/README.md) and read it from a path in "
                "params (train_input.data_dir)")

# dtypes the device has no compute for, beyond float64 (device.ir.DEVICE_DTYPES has the ones it has)
DEVICE_LACKS = {"uint8", "int8", "int16", "uint16", "uint32", "uint64", "complex64", "complex128"}
# Numpy calls whose result is float64 unless told otherwise (numpy's default dtype).
FLOAT64_NUMPY = {"numpy.random.rand", "numpy.random.randn", "numpy.random.random", "numpy.random.normal",
                 "numpy.random.uniform", "numpy.loadtxt", "numpy.genfromtxt", "numpy.linspace", "numpy.zeros",
                 "numpy.ones", "numpy.array"}
_FLOAT64_FIX = dtype_suggestion("float64")

_HOST_METRIC_FIX = {
    "pytorch": ("keep the training step to the loss: the runner logs it and writes TensorBoard; eval metrics "
                "go in the model's metrics (common.pytorch.metrics, as pytorch/mnist's Accuracy), computed on "
                "the host in --mode eval"),
    "tf": ("keep the training graph to the loss and train_op: the runner logs the loss and learning rate; "
           "compute metrics in EVAL and pass the tensors through host_call=(metric_fn, [labels, logits]), "
           "as tf/mnist's eval_metrics"),
}
_PAD_FIX = ("pad every sequence to one fixed length (a params key such as train_input.max_sequence_length): "
            "padding='max_length' with max_length, or F.pad to it")


class Reader:
    """Reads ``sources`` (one program: a script, or a folder's files) and returns findings."""

    def __init__(self, sources: list[Source], framework: str, zoo: bool,
                 params_values: Callable[[Source, ast.AST], list[tuple[object, str, int]]] | None = None):
        self.sources, self.framework, self.zoo = sources, framework, zoo
        # a zoo folder: the values a params read takes in its configs, [(value, file, line)]
        self.params_values = params_values
        self.marks: dict[ast.AST, str] = {}
        self.findings: list[Finding] = []
        self.notes: list[Note] = []
        self._mark_regions()

    # --- regions ----------------------------------------------------------------------

    def _functions(self) -> dict[str, list[tuple[Source, ast.AST]]]:
        found: dict[str, list[tuple[Source, ast.AST]]] = {}
        for src in self.sources:
            for node in ast.walk(src.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.setdefault(node.name, []).append((src, node))
        return found

    def model_classes(self) -> list[tuple[Source, ast.ClassDef]]:
        return [(s, n) for s in self.sources for n in ast.walk(s.tree)
                if isinstance(n, ast.ClassDef) and self.marks.get(n) == "model"]

    def _mark_regions(self) -> None:
        classes = [(s, n) for s in self.sources for n in ast.walk(s.tree) if isinstance(n, ast.ClassDef)]
        model, data = set(), set()
        changed = True
        while changed:  # a class deriving from a model class of these files is a model class too
            changed = False
            for src, cls in classes:
                for base in cls.bases:
                    name = src.qualname(base) or ""
                    last = name.rsplit(".", 1)[-1]
                    if cls.name not in model and (name in MODEL_BASES or last in MODEL_BASE_NAMES or last in model):
                        model.add(cls.name)
                        changed = True
                    if cls.name not in data and (name in DATA_BASES or last in data):
                        data.add(cls.name)
                        changed = True
        for src, cls in classes:
            if cls.name in data:
                self.marks[cls] = "data"
            elif cls.name in model:
                self.marks[cls] = "model"
                for item in cls.body:
                    if isinstance(item, ast.FunctionDef) and item.name in ("train_step", "compute_loss"):
                        self.marks[item] = "train"  # a Keras model's own training step
                    elif isinstance(item, ast.FunctionDef) and item.name not in _reached_from_forward(cls):
                        self.marks[item] = "host"  # generate(), configure_optimizers(): never in the step
        functions = self._functions()
        for name, defs in functions.items():
            for src, fn in defs:
                if name == "model_fn" or _builds_a_keras_model(src, fn):
                    self.marks.setdefault(fn, "model")
                elif DATA_FUNCTION.fullmatch(name) or (self.zoo and src.shown.endswith("data.py")):
                    self.marks.setdefault(fn, "data")
        for src in self.sources:
            for call in src.calls():
                name = src.call_name(call)
                host = keyword(call, "host_call")
                if isinstance(host, (ast.Tuple, ast.List)) and host.elts:
                    self._mark_named(functions, host.elts[0], "host", force=True)
                collate = keyword(call, "collate_fn")
                if collate is not None:
                    self._mark_named(functions, collate, "data")
                if name in MAPPING_CALLS and call.args:
                    self._mark_named(functions, call.args[0], "data")
                if name in ("keras.layers.Lambda",) and call.args:
                    self._mark_named(functions, call.args[0], "model")
            if self.zoo and src.shown.endswith(("model.py",)):
                for node in src.tree.body:
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                        self.marks.setdefault(node, "model")
        changed = True
        while changed:  # a function called from model (data) code is model (data) code
            changed = False
            for src in self.sources:
                for call in src.calls():
                    region = self.region(src, call)
                    if region not in ("model", "data") or not isinstance(call.func, ast.Name):
                        continue
                    for _, fn in functions.get(call.func.id, []):
                        if fn not in self.marks:
                            self.marks[fn] = region
                            changed = True
        for src in self.sources:
            for loop in ast.walk(src.tree):
                if isinstance(loop, (ast.For, ast.While, ast.AsyncFor)) and self._trains(src, loop):
                    self.marks[loop] = "train"

    def _mark_named(self, functions, node: ast.AST, region: str, force: bool = False) -> None:
        if isinstance(node, ast.Lambda):
            self.marks[node] = region
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            for _, fn in functions.get(name, []):
                if force or fn not in self.marks:
                    self.marks[fn] = region

    def training_calls(self, src: Source, root: ast.AST) -> list[ast.Call]:
        """Calls that make ``root`` a training step: backward(), optimizer.step(), tape.gradient,
        apply_gradients."""
        found = []
        for call in src.calls(root):
            func = call.func
            if not isinstance(func, ast.Attribute):
                continue
            receiver = (src.qualname(func.value) or "").lower()
            if func.attr == "backward" or func.attr == "apply_gradients" or (
                    func.attr == "step" and "optim" in receiver or receiver in ("opt", "optimizer")) or (
                    func.attr == "gradient" and "tape" in receiver):
                found.append(call)
        return found

    def _trains(self, src: Source, loop: ast.AST) -> bool:
        return bool(self.training_calls(src, loop))

    def region(self, src: Source, node: ast.AST) -> str | None:
        """The innermost region around ``node`` (a training loop inside model code is the step)."""
        for a in (node, *src.ancestors(node)):
            if a in self.marks:
                return self.marks[a]
        return None

    def in_device_code(self, src: Source, node: ast.AST) -> bool:
        """Code the device would run: model code (not an eval-only branch) and the training step."""
        return self.region(src, node) in ("model", "train") and not eval_only(src, node)

    def in_graph(self, src: Source, node: ast.AST) -> bool:
        """Code the device compiles: the model's, and a Keras train_step; not a script's training
        loop, where the host reads the loss (loss.item()) and the runner will take over."""
        for a in (node, *src.ancestors(node)):
            if a in self.marks:
                return self.marks[a] == "model" or self.marks[a] == "train" and isinstance(a, ast.FunctionDef)
        return False

    # --- findings ---------------------------------------------------------------------

    def add(self, stage: str, kind: str, src: Source, node: ast.AST | int, message: str, fix: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 0)
        self.findings.append(Finding(stage, kind, src.shown, line, message, fix))

    def note(self, src: Source, node: ast.AST | int, message: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 0)
        self.notes.append(Note(src.shown, line, message))

    def read(self) -> tuple[list[Finding], list[Note]]:
        for src in self.sources:
            for call in src.calls():
                name = src.call_name(call)
                self._network(src, call, name)
                self._data(src, call, name)
                self._dtypes(src, call, name)
                self._optimizer(src, call, name)
                self._keras(src, call, name)
                self._shapes(src, call, name)
                self._eval_metric_ops(src, call)
                if self.in_device_code(src, call):
                    if self.in_graph(src, call):
                        self._ops(src, call, name)
                    self._metrics(src, call, name)
            self._float64_attributes(src)
            self._mask_indexing(src)
        self._repeat()
        return self.findings, self.notes

    # data on the network at run time
    def _network(self, src: Source, call: ast.Call, name: str) -> None:
        what = NETWORK_CALLS.get(name)
        if name.startswith("keras.datasets.") and name.endswith(".load_data"):
            what = f"downloads {name.split('.')[-2]} (to ~/.keras/datasets) on first use"
        elif name.startswith("torchvision.datasets.") and literal(keyword(call, "download")) is True:
            what = "downloads the data set (download=True)"
        elif name in ("tensorflow_datasets.load", "tensorflow_datasets.builder") and \
                literal(keyword(call, "download"), True) is not False:
            what = "downloads and prepares the data set unless told download=False"
        elif name.endswith(".from_pretrained"):
            first = literal(keyword(call, "pretrained_model_name_or_path", 0))
            if isinstance(first, str) and not first.startswith((".", "/", "~")):
                what = f"downloads {first!r} from the Hugging Face hub"
        elif re.fullmatch(r"torchvision\.models\.(\w+\.)?[a-z]\w*", name) and "handle" not in name and (
                literal(keyword(call, "pretrained")) is True or
                (keyword(call, "weights") is not None and literal(keyword(call, "weights"), NOT_LITERAL) is not None)):
            what = "downloads pretrained weights"
        if what is None:
            url = next((a for a in [*call.args, *(k.value for k in call.keywords)]
                        if isinstance(a, ast.Constant) and isinstance(a.value, str) and _URL.match(a.value)), None)
            if url is not None and _READER.fullmatch(name.rsplit(".", 1)[-1]):
                what = f"reads {url.value}"
        if what is not None:
            self.add("data", "network", src, call, f"{src.segment(call)} {what} at run time", _NETWORK_FIX)

    # static batches and a repeating training set
    def _data(self, src: Source, call: ast.Call, name: str) -> None:
        if name == "torch.utils.data.DataLoader":
            if keyword(call, "batch_sampler") is not None or literal(keyword(call, "batch_size", 1), 1) is None:
                return  # batching is the user's own sampler's: nothing to read here
            self._static_batches(src, call, keyword(call, "drop_last"), "drop_last", "DataLoader")
        elif name in (".batch", ".padded_batch") and src.imports("tensorflow", "keras") and \
                not self._read_on_host(src, call):
            self._static_batches(src, call, keyword(call, "drop_remainder", 1), "drop_remainder", name[1:])
            if name == ".padded_batch" and keyword(call, "padded_shapes", 1) is None:
                self.add("data", "dynamic_shape", src, call,
                         f"{src.segment(call)} pads each batch to its longest element: the shapes change from "
                         "batch to batch", "padded_shapes= with a fixed length for every dimension, "
                         "and drop_remainder=True")
        elif name == ".repeat" and src.imports("tensorflow", "keras"):
            count = literal(keyword(call, "count", 0), NOT_LITERAL)
            if isinstance(count, int) and count >= 0:
                self.add("data", "no_repeat", src, call,
                         f"{src.segment(call)} ends after {count} pass(es): training runs runconfig.max_steps steps "
                         "from a dataset that never ends", "dataset.repeat() with no count, in TRAIN")

    def _read_on_host(self, src: Source, call: ast.Call) -> bool:
        """A dataset batched to be read into numpy (``tfds.as_numpy(ds.batch(10_000))``, a for loop over it)
        feeds the host, not the model: its last batch may be partial."""
        node = call
        for parent in src.ancestors(call):
            if isinstance(parent, ast.Call) and (src.call_name(parent) in HOST_READERS or node is not parent.func
                                                 and src.call_name(parent) in ("list", "tuple")):
                return True
            if isinstance(parent, ast.Attribute) and parent.attr in ("as_numpy_iterator", "numpy"):
                return True
            if isinstance(parent, (ast.For, ast.comprehension)) and node is parent.iter:
                return True
            if isinstance(parent, (ast.stmt, ast.Lambda)):
                return False
            node = parent
        return False

    def _static_batches(self, src: Source, call: ast.Call, flag: ast.AST | None, name: str, what: str) -> None:
        fix = f"{what}(..., {name}=True): every batch full, one static shape"
        if flag is None or literal(flag, NOT_LITERAL) is False:
            given = "" if flag is None else f" {name}=False"
            self.add("data", "no_drop_last", src, call,
                     f"{src.segment(call)}{given}: the last batch of an epoch is smaller whenever the batch size "
                     "does not divide the data set, a batch dimension the device cannot compile", fix)
            return
        if literal(flag, NOT_LITERAL) is True:
            return
        values = self.params_values(src, flag) if self.params_values else []
        for value, file, line in values:
            if value is False:
                self.findings.append(Finding("data", "no_drop_last", file, line,
                                             f"{name} is false here, and {src.shown}:{call.lineno} batches with it: "
                                             "the last batch of an epoch is smaller", f"set it to true"))
        if not values:
            self.note(src, call, f"{name}={src.segment(flag)}: could not tell whether it is True "
                                 "(the device needs every batch full)")

    def _repeat(self) -> None:
        """A TF training set must repeat: the device runs max_steps steps from a dataset that never ends."""
        batches, repeats = [], 0
        for src in self.sources:
            if not src.imports("tensorflow", "keras"):
                continue
            for call in src.calls():
                name = src.call_name(call)
                if name in (".batch", ".padded_batch"):
                    batches.append((src, call))
                elif name == ".repeat":
                    repeats += 1
        if batches and not repeats:
            src, call = batches[0]
            self.add("data", "no_repeat", src, call,
                     f"the dataset batched at {src.segment(call)} never repeats: training runs runconfig.max_steps "
                     "steps from a dataset that never ends", "dataset.repeat() before batch, in TRAIN")

    # dtypes
    def _dtypes(self, src: Source, call: ast.Call, name: str) -> None:
        if self.region(src, call) == "host":
            return
        if name in ("torch.set_default_dtype", "keras.backend.set_floatx", "keras.config.set_floatx",
                    "torch.set_default_tensor_type"):
            value = src.segment(call.args[0]) if call.args else ""
            if "64" in value or "double" in value.lower():
                self.add("model", "dtype", src, call, f"{src.segment(call)}: every weight and activation in float64",
                         _FLOAT64_FIX)
        elif name == ".double" and not call.args:
            self.add("model", "dtype", src, call, f"{src.segment(call)} makes float64 values", _FLOAT64_FIX)
        elif name in ("torch.from_numpy", "torch.tensor", "torch.as_tensor", "torch.Tensor") and call.args and \
                keyword(call, "dtype") is None and self._numpy_float64(src, call.args[0]):
            self.add("data", "dtype", src, call, f"{src.segment(call)} is float64: numpy's default dtype",
                     "astype(np.float32) first, or torch.tensor(..., dtype=torch.float32)")
        dtype = keyword(call, "dtype")  # a framework's tensor or layer asked for float64 (numpy's are the host's)
        if isinstance(dtype, ast.Constant) and dtype.value in ("float64", "double") and \
                name.startswith(("torch.", "tensorflow.", "keras.", ".to")):
            self.add("model", "dtype", src, call, f"{src.segment(call)} asks for float64", _FLOAT64_FIX)

    def _float64_attributes(self, src: Source) -> None:
        """``torch.float64`` / ``tf.float64`` anywhere but the host's code; the dtypes the device has no
        compute for at all (uint8, complex) where the device runs them: in the model."""
        seen = {(f.file, f.line) for f in self.findings if f.kind == "dtype"}
        for node in ast.walk(src.tree):
            if not isinstance(node, ast.Attribute) or (src.shown, node.lineno) in seen:
                continue
            name = src.qualname(node) or ""
            module, _, dtype = name.rpartition(".")
            if module not in ("torch", "tensorflow", "keras", "numpy"):
                continue
            dtype = {"double": "float64", "cfloat": "complex64", "cdouble": "complex128"}.get(dtype, dtype)
            if dtype == "float64" and module != "numpy" and self.region(src, node) != "host" or \
                    dtype in DEVICE_LACKS and self.in_device_code(src, node) and self.in_graph(src, node):
                seen.add((src.shown, node.lineno))
                self.add("model", "dtype", src, node, f"{src.segment(node)}: {dtype} values, which the device "
                         "does not compute in", dtype_suggestion(dtype))

    def _numpy_float64(self, src: Source, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):  # x = np.random.rand(...); torch.from_numpy(x)
            scope = src.enclosing(node, ast.FunctionDef, ast.AsyncFunctionDef) or src.tree
            values = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign) and a.lineno < node.lineno
                      and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)]
            return bool(values) and self._numpy_float64(src, values[-1])
        if not isinstance(node, ast.Call):
            return False
        name = src.call_name(node)
        if name == ".astype" and node.args:
            return src.segment(node.args[0]) in ("np.float64", "numpy.float64", "float", "'float64'", '"float64"')
        if name in FLOAT64_NUMPY:
            dtype = keyword(node, "dtype")
            return dtype is None and (name != "numpy.array" or any(
                isinstance(a, ast.Constant) and isinstance(a.value, float) for a in ast.walk(node)))
        return False

    # optimizers
    def _optimizer(self, src: Source, call: ast.Call, name: str) -> None:
        if not name.startswith(OPTIMIZER_MODULES) or name.count(".") < 2:
            return
        cls = name.rsplit(".", 1)[-1]
        if not cls[:1].isupper() or cls in SUPPORTED_OPTIMIZERS or "lr_scheduler" in name or "schedules" in name \
                or cls in ("Optimizer", "LossScaleOptimizer", "Checkpoint", "ExponentialMovingAverage"):
            return
        self.add("model", "optimizer", src, call,
                 f"optimizer {cls}: the device's update rules are SGD, momentum, Adam and AdamW", _OPTIMIZER_FIX)

    # Keras compile and fit: the training loop and metrics compiled into the step
    def _keras(self, src: Source, call: ast.Call, name: str) -> None:
        if name == ".compile" and (keyword(call, "loss") is not None or keyword(call, "optimizer", 0) is not None):
            metrics = keyword(call, "metrics")
            if metrics is not None and not (isinstance(metrics, (ast.List, ast.Tuple)) and not metrics.elts):
                self.add("model", "metrics_in_graph", src, metrics,
                         f"compile(metrics={src.segment(metrics, 40)}) computes the metrics in every training step",
                         _HOST_METRIC_FIX["tf"])
            optimizer = keyword(call, "optimizer", 0)
            if isinstance(optimizer, ast.Constant) and isinstance(optimizer.value, str) and \
                    optimizer.value.lower() not in SUPPORTED_OPTIMIZERS:
                self.add("model", "optimizer", src, optimizer,
                         f"optimizer {optimizer.value!r}: the device's update rules are SGD, momentum, Adam and AdamW",
                         _OPTIMIZER_FIX)
        if name == ".fit" and call.args and src.imports("tensorflow", "keras") and \
                not self._is_dataset(src, call.args[0], call.lineno):
            self.add("data", "fit_arrays", src, call,
                     f"{src.segment(call)} batches in-memory arrays: the last batch of each epoch is partial and "
                     "nothing repeats", "an input_fn(params, mode) returning tf.data.Dataset.from_tensor_slices("
                     "(x, y)), shuffled, .repeat() in TRAIN, .batch(batch_size, drop_remainder=True)")

    def _is_dataset(self, src: Source, node: ast.AST, line: int) -> bool:
        """Whether ``node`` is a tf.data pipeline (or a Keras data generator), by how it was made."""
        if isinstance(node, ast.Name):
            scope = src.enclosing(node, ast.FunctionDef, ast.AsyncFunctionDef) or src.tree
            values = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign) and a.lineno <= line and
                      any(isinstance(t, ast.Name) and t.id == node.id for target in a.targets
                          for t in ast.walk(target))]
            if not values:
                return True  # not known to be arrays: say nothing
            node = max(values, key=lambda v: v.lineno)
        names = {src.call_name(c) for c in src.calls(node)} if isinstance(node, ast.AST) else set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {
                c.name for s in self.sources for c in ast.walk(s.tree) if isinstance(c, ast.ClassDef)}:
            return True  # an instance of the user's own class: a Sequence or generator
        return any(n.startswith(("tensorflow.data.", "tensorflow_datasets.")) or n in (
            ".batch", ".padded_batch", ".map", ".repeat", ".prefetch", ".shuffle") for n in names)

    # shapes that change from batch to batch
    def _shapes(self, src: Source, call: ast.Call, name: str) -> None:
        if name == "torch.nn.utils.rnn.pad_sequence" or name == "transformers.DataCollatorWithPadding":
            self.add("data", "dynamic_shape", src, call,
                     f"{src.segment(call)} pads each batch to its longest sequence: the sequence dimension changes "
                     "from batch to batch", _PAD_FIX)
        padding = keyword(call, "padding")
        if name.startswith(".") and padding is not None and literal(padding, NOT_LITERAL) in (True, "longest") and \
                (keyword(call, "truncation") is not None or "token" in src.segment(call.func).lower()):
            self.add("data", "dynamic_shape", src, call,
                     f"{src.segment(call)} pads each batch to its longest sequence: the sequence dimension changes "
                     "from batch to batch", _PAD_FIX)
        if name in ("keras.Input", "keras.layers.Input", "keras.layers.InputLayer"):
            shape = literal(keyword(call, "shape", 0), NOT_LITERAL)
            self._none_dims(src, call, shape, "shape")
        for key in ("input_shape", "batch_input_shape"):
            if name.startswith("keras.") and keyword(call, key) is not None:
                shape = literal(keyword(call, key), NOT_LITERAL)
                self._none_dims(src, call, shape[1:] if key == "batch_input_shape" and isinstance(shape, tuple)
                                else shape, key)
        one_argument = len(call.args) == 1 and not call.keywords
        if (name == "tensorflow.boolean_mask" or (name == "tensorflow.where" and one_argument)) and \
                self.in_device_code(src, call):
            self.add("model", "dynamic_shape", src, call,
                     f"{src.segment(call)} selects a data-dependent number of elements", refused_op("tf", "Where"))
        if name == "torch.where" and one_argument and self.in_device_code(src, call):
            self.add("model", "dynamic_shape", src, call,
                     f"{src.segment(call)} selects a data-dependent number of elements",
                     refused_op("torch", "aten.nonzero.default"))

    def _none_dims(self, src: Source, call: ast.Call, shape, key: str) -> None:
        if isinstance(shape, (tuple, list)) and any(d is None for d in shape):
            self.add("model", "dynamic_shape", src, call,
                     f"{key}={shape!r}: a dimension of None changes from batch to batch",
                     "give every dimension a size: pad sequences to one length in the input pipeline")

    # ops the device has no kernel for (model code only)
    def _ops(self, src: Source, call: ast.Call, name: str) -> None:
        op = UNSUPPORTED_CALLS.get(name) or next(
            (v for k, v in UNSUPPORTED_PREFIXES.items() if name.startswith(k)), None)
        if op == "ragged":
            self.add("model", "dynamic_shape", src, call, f"{src.segment(call)}: a ragged tensor", _RAGGED)
            return
        fn = src.enclosing(call, ast.FunctionDef, ast.AsyncFunctionDef)
        if op is not None and fn is not None and fn.name in CONSTRUCTION_METHODS and \
                isinstance(src.parents.get(fn), ast.ClassDef):
            op = None  # a tensor op while the model is constructed runs on the host, once
        suggestion = op and refused_op("tf" if name.startswith("tensorflow.") else "torch", op)
        if suggestion:  # None: the frontend lowers it
            what = name[1:] if name.startswith(".") else src.segment(call.func)  # as the user spelt it
            self.add("model", "unsupported_op", src, call, f"{src.segment(call)}: {what} has no kernel on the device",
                     suggestion)
            return
        layer = UNSUPPORTED_LAYERS.get(name)
        if layer is None and name in KERAS_UNSUPPORTED_LAYERS:
            layer = (None, KERAS_UNSUPPORTED_LAYERS[name], "")
        if layer is not None:
            arg, what, form = layer
            fix = refused_op("torch", "aten.convolution.default", form) if form else _CONV_FIX
            value = literal(keyword(call, arg), NOT_LITERAL) if arg else None
            if fix and (arg is None or (isinstance(value, int) and value > 1)):
                self.add("model", "unsupported_op", src, call,
                         f"{src.segment(call)}: {what} has no kernel on the device", fix)
            elif keyword(call, arg) is not None and value is NOT_LITERAL:
                self.note(src, call, f"{arg}={src.segment(keyword(call, arg))}: could not tell whether it is 1 "
                                     f"(more is a {what}, which has no kernel on the device)")

    def _mask_indexing(self, src: Source) -> None:
        """``x[x > 0]``, ``logits[keep]`` with ``keep = labels != -100``: as many elements as the mask holds."""
        lines = set()
        for node in ast.walk(src.tree):
            if not isinstance(node, ast.Subscript) or node.lineno in lines or not (
                    self.in_device_code(src, node) and self.in_graph(src, node)):
                continue
            if isinstance(node.slice, (ast.Compare, ast.BoolOp)) or isinstance(node.slice, ast.Name) and \
                    self._assigned_a_comparison(src, node.slice):
                lines.add(node.lineno)
                self.add("model", "dynamic_shape", src, node,
                         f"{src.segment(node)} selects a data-dependent number of elements",
                         refused_op("torch", "aten.masked_select.default"))

    def _assigned_a_comparison(self, src: Source, name: ast.Name) -> bool:
        scope = src.enclosing(name, ast.FunctionDef, ast.AsyncFunctionDef)
        if scope is None:
            return False
        values = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign) and a.lineno < name.lineno and
                  any(isinstance(t, ast.Name) and t.id == name.id for t in a.targets)]
        return bool(values) and isinstance(values[-1], ast.Compare) and not any(
            isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for o in values[-1].ops)

    # metrics and summaries in the training graph
    def _metrics(self, src: Source, call: ast.Call, name: str) -> None:
        fix = _HOST_METRIC_FIX[self.framework]
        if name.startswith("tensorflow.summary.") and name != "tensorflow.summary.create_file_writer":
            self.add("model", "summary_in_graph", src, call,
                     f"{src.segment(call)} writes a summary from the training graph", fix)
        elif name.startswith(("tensorflow.metrics.", "keras.metrics.", "torchmetrics.")) or \
                name in (".add_metric", ".update_state"):
            self.add("model", "metrics_in_graph", src, call,
                     f"{src.segment(call)} computes a metric in the training graph", fix)
        elif name in (".add_scalar", ".add_scalars", ".add_histogram", ".add_image", "wandb.log"):
            self.add("model", "summary_in_graph", src, call,
                     f"{src.segment(call)} writes a summary from the training step", fix)
        elif name in (".eq", ".argmax") and self._accuracy(src, call):
            self.add("model", "metrics_in_graph", src, call,
                     f"{src.segment(call)} computes accuracy in the training step", fix)

    def _eval_metric_ops(self, src: Source, call: ast.Call) -> None:
        """EVAL's metrics leave the device through host_call (the contract), never eval_metric_ops."""
        ops = keyword(call, "eval_metric_ops")
        if ops is not None and literal(ops, NOT_LITERAL) is not None:
            self.add("model", "metrics_in_graph", src, call,
                     "eval_metric_ops: metrics in the device's graph; they leave it through host_call",
                     "host_call=(metric_fn, [labels, logits]): metric_fn builds the metrics on the host, "
                     "as tf/mnist's eval_metrics")

    def _accuracy(self, src: Source, call: ast.Call) -> bool:
        """``pred.eq(target)`` or ``(logits.argmax(1) == labels)``: comparing predictions with labels."""
        if src.call_name(call) == ".eq":
            return True
        parent = src.parents.get(call)
        while isinstance(parent, (ast.Call, ast.Attribute)):
            parent = src.parents.get(parent)
        return isinstance(parent, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in parent.ops)


def _builds_a_keras_model(src: Source, fn: ast.AST) -> bool:
    """A function that returns a Keras model it builds (``return keras.Model(inputs, outputs)``, or a
    name assigned one): model code. A main() that builds one and then trains and predicts is not."""
    built = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and src.call_name(n.value) in KERAS_BUILDERS for t in n.targets if isinstance(t, ast.Name)}
    for ret in (n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None):
        if isinstance(ret.value, ast.Call) and src.call_name(ret.value) in KERAS_BUILDERS or \
                isinstance(ret.value, ast.Name) and ret.value.id in built:
            return True
    return False


# methods that construct a model: their tensor ops run once, on the host (the layers they build count)
CONSTRUCTION_METHODS = {"__init__", "build", "reset_parameters", "_init_weights", "init_weights", "_reset_parameters"}
# the methods of a model class the runner's step calls (PyTorch, Keras, the zoo's PyTorchBaseModel)
STEP_METHODS = ("__init__", "forward", "__call__", "call", "build", "train_step", "compute_loss", "loss")


def _reached_from_forward(cls: ast.ClassDef) -> set[str]:
    """Methods the forward pass (or the constructor) calls through ``self.name(...)``, transitively;
    a method under @torch.no_grad is not part of a training step."""
    methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    reached, todo = set(), [n for n in STEP_METHODS if n in methods]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        method = methods[name]
        if any("no_grad" in ast.unparse(d) or "inference_mode" in ast.unparse(d) for d in method.decorator_list):
            continue
        reached.add(name)
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr in methods:
                todo.append(node.attr)
    return reached


def eval_only(src: Source, node: ast.AST) -> bool:
    """Whether ``node`` sits in a branch that runs only when evaluating (``if not self.training:``,
    ``if mode == ModeKeys.EVAL:``, the else of ``if self.training:``), where the host runs metrics."""
    child = node
    for a in src.ancestors(node):
        block = next((b for b in ("body", "orelse", "finalbody") if isinstance(getattr(a, b, None), list)
                      and any(child is n for n in getattr(a, b))), None)
        if block is not None:  # `if mode == TRAIN: return ...` earlier in the block: the rest is evaluation
            siblings = getattr(a, block)
            for earlier in siblings[:next(i for i, n in enumerate(siblings) if n is child)]:
                if isinstance(earlier, ast.If) and earlier.body and isinstance(earlier.body[-1], ast.Return) and \
                        re.search(r"\btraining\b|==\s*\S*TRAIN\b|['\"]train['\"]", ast.unparse(earlier.test)) and \
                        not re.search(r"\bnot\b", ast.unparse(earlier.test)):
                    return True
        if isinstance(a, (ast.With, ast.AsyncWith)) and any(
                re.search(r"no_grad|inference_mode", ast.unparse(item.context_expr)) for item in a.items):
            return True  # no gradients: evaluation, even inside the epoch loop
        if isinstance(a, (ast.For, ast.AsyncFor)) and child is not a.iter and \
                re.search(r"\b\w*(val|valid|validation|test|eval)\w*\b", ast.unparse(a.iter), re.I) and \
                not re.search(r"train", ast.unparse(a.iter), re.I):
            return True  # a loop over the validation or test data
        if isinstance(a, ast.If):
            test = ast.unparse(a.test)
            in_body = any(child is n for n in a.body)
            evaluating = re.search(r"\bnot\b.*\btraining\b|\bEVAL\b|['\"]eval['\"]|!=\s*\S*TRAIN\b", test)
            training = re.search(r"\btraining\b|==\s*\S*TRAIN\b", test) and not evaluating
            if (in_body and evaluating) or (not in_body and training):
                return True
        elif isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)) and re.fullmatch(
                r"(eval|evaluate|test|validate|valid|validation)(_.*)?|.*_(eval|test|metrics?)", a.name):
            return True
        child = a
    return False


def plain_script_findings(reader: Reader) -> list[Finding]:
    """What a plain script (or folder of scripts) lacks of the zoo's structure, at the lines
    that will move: the model, the data code, the training loop, the settings."""
    findings = []
    framework = reader.framework
    first = reader.sources[0]
    model_at = root_model_class(reader)
    keras_model = _first_call(reader, KERAS_BUILDERS) if framework == "tf" else None
    if model_at is None:
        built = find_construction(reader)
        if built is not None:
            model_at = (built.src, built.stmt)
    if framework == "pytorch":
        if model_at and isinstance(model_at[1], ast.ClassDef):
            src, cls = model_at
            findings.append(Finding(
                "port", "no_model_fn", src.shown, cls.lineno,
                f"{cls.name} is a plain nn.Module: the runner takes model_fn(params, device) returning a "
                "PyTorchBaseModel",
                f"zoo new <name> --from pytorch/mnist; in model.py keep {cls.name}, wrap it in a PyTorchBaseModel "
                "whose __call__(batch) returns the loss, and build it from params in model_fn(params, device)"))
        elif model_at:
            src, stmt = model_at
            findings.append(Finding(
                "port", "no_model_fn", src.shown, stmt.lineno,
                f"{src.segment(stmt.value, 40)} is a plain nn.Module: the runner takes model_fn(params, device) "
                "returning a PyTorchBaseModel",
                "zoo new <name> --from pytorch/mnist; in model.py build this module from params, wrap it in a "
                "PyTorchBaseModel whose __call__(batch) returns the loss, and return it from model_fn(params, device)"))
        else:
            findings.append(Finding("port", "no_model_fn", first.shown, 0, "no nn.Module found",
                                    "zoo new <name> --from pytorch/mnist, and put the model in model.py"))
        loaders = _first_call(reader, {"torch.utils.data.DataLoader"})
        where = loaders or (first, 0)
        findings.append(Finding(
            "port", "no_data_fn", where[0].shown, getattr(where[1], "lineno", 0),
            "the data code is not in data.py's get_train_dataloader(params) / get_eval_dataloader(params)",
            "move it into data.py: each function returns a DataLoader built from params['train_input'] / "
            "params['eval_input'] (batch_size, shuffle, drop_last, data_dir)"))
    else:
        where = keras_model or (model_at and (model_at[0], model_at[1])) or (first, 0)
        findings.append(Finding(
            "port", "no_model_fn", where[0].shown, getattr(where[1], "lineno", 0),
            "the model is not built by model_fn(features, labels, mode, params)",
            "zoo new <name> --from tf/mnist; in model.py build the model in model_fn, compute the loss and return "
            "EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params)) in TRAIN"))
        data_at = _first_call(reader, {"tensorflow.data.Dataset.from_tensor_slices", "tensorflow_datasets.load",
                                        ".batch"}) or _first_load_data(reader)
        where = data_at or (first, 0)
        findings.append(Finding(
            "port", "no_input_fn", where[0].shown, getattr(where[1], "lineno", 0),
            "the data code is not in data.py's input_fn(params, mode) returning a tf.data.Dataset",
            "move it into data.py: input_fn(params, mode) returns a Dataset of (features, labels) built from "
            "params['train_input'] / params['eval_input']"))
    loop = _training_loop(reader)
    if loop is not None:
        src, node, what = loop
        runner = "common.pytorch.run.run" if framework == "pytorch" else "common.tf.run.run"
        findings.append(Finding(
            "port", "own_training_loop", src.shown, node.lineno,
            f"the script trains itself ({what}): on the device the runner does",
            f"drop the loop: run.py hands the model and data functions to {runner}; steps, checkpoints and logs "
            "come from params runconfig"))
    settings = _settings(reader)
    findings.append(Finding(
        "port", "no_defaults", settings[0].shown, settings[1],
        "no utils.py defaults and no configs/params.yaml: " + settings[2],
        "declare each setting in utils.py default_params() and configs/params.yaml; the runner checks them "
        "and overrides come as section.key=value"))
    return findings


def root_model_class(reader: Reader) -> tuple[Source, ast.ClassDef] | None:
    """The model as a whole: the model class the code builds outside any model class, else one
    that no other model class uses, else the first."""
    classes = reader.model_classes()
    names = {c.name for _, c in classes}
    built, inner = [], set()
    for src in reader.sources:
        for call in src.calls():
            if isinstance(call.func, ast.Name) and call.func.id in names:
                owner = src.enclosing(call, ast.ClassDef)
                if owner is not None and reader.marks.get(owner) == "model":
                    inner.add(call.func.id)
                else:
                    built.append(call.func.id)
    for wanted in (built, [c.name for _, c in classes if c.name not in inner]):
        for name in wanted:
            match = next(((s, c) for s, c in classes if c.name == name), None)
            if match:
                return match
    return classes[0] if classes else None


def _first_call(reader: Reader, names: Iterable[str]) -> tuple[Source, ast.Call] | None:
    names = set(names)
    for src in reader.sources:
        for call in sorted(src.calls(), key=lambda c: c.lineno):
            if src.call_name(call) in names:
                return src, call
    return None


def _first_load_data(reader: Reader) -> tuple[Source, ast.Call] | None:
    for src in reader.sources:
        for call in sorted(src.calls(), key=lambda c: c.lineno):
            name = src.call_name(call)
            if name.endswith(".load_data") or reader.region(src, call) == "data":
                return src, call
    return None


def _training_loop(reader: Reader) -> tuple[Source, ast.AST, str] | None:
    for src in reader.sources:
        for call in sorted(src.calls(), key=lambda c: c.lineno):
            if src.call_name(call) == ".fit" and (call.args or keyword(call, "x") is not None):
                return src, call, f"{src.segment(call, 40)}"
        loops = sorted((n for n, r in reader.marks.items() if r == "train" and isinstance(
            n, (ast.For, ast.While, ast.AsyncFor)) and n in src.parents), key=lambda n: n.lineno)
        for loop in loops:
            if any(loop is n for n in ast.walk(src.tree)):
                steps = ", ".join(sorted({f"{src.segment(c.func, 30)}()" for c in reader.training_calls(src, loop)}))
                return src, loop, steps
    return None


# argparse flags and constants that map onto the zoo's params keys
_PARAMS_OF_SETTING = (
    (re.compile(r"(train_)?batch[_-]?size|bs"), "train_input.batch_size"),
    (re.compile(r"(eval|test|val)[_-]?batch[_-]?size"), "eval_input.batch_size"),
    (re.compile(r"lr|learning[_-]?rate"), "optimizer.learning_rate"),
    (re.compile(r"epochs?|num[_-]?epochs|n[_-]?epochs"), "runconfig.max_steps (steps, not epochs)"),
    (re.compile(r"(max[_-]?)?(steps|iters|iterations)"), "runconfig.max_steps"),
    (re.compile(r"seed"), "runconfig.seed"),
    (re.compile(r"momentum"), "optimizer.momentum"),
    (re.compile(r"(weight[_-]?decay|wd)"), "optimizer.weight_decay"),
    (re.compile(r"data[_-]?(dir|root|path)|root"), "train_input.data_dir"),
    (re.compile(r"log[_-]?(interval|every|steps)"), "runconfig.log_steps"),
    (re.compile(r"save[_-]?(model|every|interval|steps)|checkpoint.*"), "runconfig.checkpoint_steps"),
    (re.compile(r"dropout"), "model.dropout"),
)


def _settings(reader: Reader) -> tuple[Source, int, str]:
    """Where the script's settings live, and the params keys the usual ones become."""
    flags = []
    for src in reader.sources:
        for call in src.calls():
            if src.call_name(call) == ".add_argument" and call.args and isinstance(call.args[0], ast.Constant) \
                    and str(call.args[0].value).startswith("--"):
                flags.append((src, call, str(call.args[0].value)))
    if flags:
        src, first, _ = flags[0]
        mapped = []
        for _, _, flag in flags:
            name = flag.lstrip("-").lower()
            key = next((k for pattern, k in _PARAMS_OF_SETTING if pattern.fullmatch(name)), None)
            if key:
                mapped.append(f"{flag} -> {key}")
        text = f"{len(flags)} argparse flag(s)" + (f" ({'; '.join(mapped)})" if mapped else "")
        return src, first.lineno, text
    for src in reader.sources:
        for cls in ast.walk(src.tree):
            if isinstance(cls, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
                fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and
                          isinstance(n.target, ast.Name)]
                text = ", ".join(fields[:6]) + (", ..." if len(fields) > 6 else "")
                return src, cls.lineno, f"the settings are the fields of {cls.name} ({text})"
    for src in reader.sources:
        constants = [n for n in src.tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                     and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
                     and isinstance(literal(n.value, NOT_LITERAL), (int, float, str))]
        if constants:
            names = ", ".join(c.targets[0].id for c in constants[:6]) + (", ..." if len(constants) > 6 else "")
            return src, constants[0].lineno, f"the settings are module constants ({names})"
    loop = _training_loop(reader)
    src = loop[0] if loop else reader.sources[0]
    return src, 0, "the settings are written into the code"


# --- the statement that builds the model (also common/port/script.py's starting point) ---

MODEL_NAMES = ("model", "net", "network", "classifier", "m")


def assignment_targets(stmt) -> list[ast.AST]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    out = []
    for t in targets:
        out.append(t)
        if isinstance(t, (ast.Tuple, ast.List)):
            out.extend(t.elts)
    return out


# method calls around a construction that only move or mode-switch the model
_MOVES = {"to", "cuda", "cpu", "train", "eval", "float"}


def _unwrap_moves(expr: ast.AST) -> ast.AST:
    """``Net().to(device).train()`` -> ``Net()``; ``.to(torch.float64)`` and ``.double()`` stay."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _MOVES:
        if expr.func.attr == "to" and any(w in ast.unparse(a) for a in expr.args for w in ("float", "double", "half")):
            break
        expr = expr.func.value
    return expr


@dataclass
class Construction:
    src: Source
    stmt: ast.AST
    expr: ast.AST
    name: str  # the variable the model is bound to


def find_construction(reader: Reader) -> Construction | None:
    """The assignment that builds the model: a model class of these files, a torchvision model,
    a Keras model, or a function of these files that returns one."""
    model_classes = {c.name for _, c in reader.model_classes()}
    builders = {fn.name for n, r in reader.marks.items() if r == "model" for fn in [n]
                if isinstance(fn, ast.FunctionDef)}
    found = []
    for src in reader.sources:
        for stmt in ast.walk(src.tree):
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                continue
            targets = [t for t in assignment_targets(stmt) if isinstance(t, ast.Name)]
            if len(targets) != 1:
                continue
            expr = _unwrap_moves(stmt.value)
            while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
                    expr.func.attr in ("double", "half", "to"):
                expr = expr.func.value
            if not isinstance(expr, ast.Call):
                continue
            name = src.call_name(expr)
            leaf = name.rsplit(".", 1)[-1]
            if src.enclosing(stmt, ast.ClassDef) is not None:
                continue  # a layer built inside a model class is part of that model
            container = name in ("torch.nn.Sequential", "torch.nn.ModuleDict") and targets[0].id.lower() in MODEL_NAMES
            if leaf in model_classes or container or name.startswith("torchvision.models.") and leaf[:1].islower() or \
                    name in KERAS_BUILDERS - {"keras.Input", "keras.layers.Input"} or \
                    leaf in builders and leaf != "model_fn":
                found.append((targets[0].id.lower() not in MODEL_NAMES, src.path, stmt.lineno,
                              Construction(src, stmt, _unwrap_moves(stmt.value), targets[0].id)))
    if not found:
        return None
    return min(found, key=lambda f: f[:3])[3]

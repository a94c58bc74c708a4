"""Calibration of the cost model: the published training runs on one CS-2, and the command
that compiles each one's shape and compares.

    python -m device.calibration [--framework pytorch|tf] [--point NAME ...] [--write-readme]

``PUBLISHED_RUNS`` is the calibration set, one literal table: a run of the vendor's software
on ONE CS-2 whose log printed its throughput, with the shape it trained (model, batch,
sequence length, precision, execution mode), the release, where it was published (a
repository at a commit and the file) and the log line quoted. Runs on a CS-3 or on several
systems are not in it. Each run names the zoo config that reproduces its shape (a folder
with a twin in pytorch/ and tf/, a config and overrides), or no folder where the zoo has none.

The command compiles every point (``run.py --compile_only`` of its folder on profile wse2,
each in its own process: no weights, the compile report read back) and prints the table of
estimate, published figure and their ratio; ``--write-readme`` writes that table into
device/README.md between its framework's markers. Nothing here is tuned to the figures.

``bert_large_graph`` is the older calibration model, BERT-Large built by hand from IR ops (no
framework); ``predict`` compiles it on wse2 and benchmarks/cost_calibration.py prints it
against wafer-facts.md's rounded ~6,400 samples/s. Its simplifications, each keeping the work
and memory of the real model:
- the attention mask arrives as an additive (B, 1, 1, T) input, computed on the host;
- the masked-LM head runs on the first ``max_predictions`` positions of each sequence,
  a stand-in with the same shapes as gathering the 20 masked positions (BERT's
  pretraining setting for T = 128); the decoder is tied to the word embeddings;
- no next-sentence head (a 1024 x 2 dense layer on one token: negligible).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from device.api import CompileResult, compile_graph
from device.graphs import GraphBuilder, attention_block, default_optimizer, layer_norm
from device.ir import Graph
from zoo_base.errors import UserError

# wafer-facts.md, "Calibration figure": samples/s observed (windows ranged 6,400-8,600)
OBSERVED_SAMPLES_PER_S = 6400.0
EPS = 1e-12  # BERT's layer-norm epsilon


def bert_large_graph(batch: int = 1024, seq: int = 128, layers: int = 24, hidden: int = 1024, heads: int = 16,
                     ffn: int = 4096, vocab: int = 30522, max_predictions: int = 20,
                     precision: str = "float16") -> Graph:
    """BERT pretraining (masked-LM loss) as a device IR graph, adamw, mixed precision."""
    b = GraphBuilder(file="bert_large.py", precision=precision)
    ids = b.input("input_ids", (batch, seq), "int32")
    types = b.input("segment_ids", (batch, seq), "int32")
    mask = b.input("attention_bias", (batch, 1, 1, seq))  # 0 for tokens, -10000 for padding
    labels = b.input("masked_lm_ids", (batch * max_predictions,), "int32")
    act = (batch, seq, hidden)

    # embeddings: word + segment + position, layer norm, dropout
    word = b.param("embeddings.word", (vocab, hidden))
    x = b.op("embedding", [word, ids], act)
    x = b.op("add", [x, b.op("embedding", [b.param("embeddings.segment", (2, hidden)), types], act)], act)
    x = b.op("add", [x, b.param("embeddings.position", (seq, hidden))], act)
    x = layer_norm(b, x, "embeddings.ln", EPS)
    x = b.op("dropout", [x], act, attrs={"rate": 0.1})

    for i in range(layers):
        name = f"layer{i}"
        x = attention_block(b, x, heads, name=f"{name}.attention", mask=mask, dropout=0.1, eps=EPS)
        h = b.dense(x, ffn, activation="gelu", name=f"{name}.intermediate")
        h = b.op("dropout", [b.dense(h, hidden, name=f"{name}.output")], act, attrs={"rate": 0.1})
        x = layer_norm(b, b.op("add", [x, h], act), f"{name}.output_ln", EPS)

    # masked-LM head on max_predictions positions: dense + gelu, layer norm, tied decoder, softmax loss
    rows = batch * max_predictions
    picked = b.op("slice", [x], (batch, max_predictions, hidden),
                  attrs={"begin": [0, 0, 0], "end": [batch, max_predictions, hidden], "step": [1, 1, 1]})
    picked = b.op("reshape", [picked], (rows, hidden), attrs={"shape": [rows, hidden]})
    t = layer_norm(b, b.dense(picked, hidden, activation="gelu", name="mlm.transform"), "mlm.ln", EPS)
    decoder = b.op("transpose", [word], (hidden, vocab), attrs={"perm": [1, 0]})
    logits = b.op("add", [b.op("matmul", [t, decoder], (rows, vocab)), b.param("mlm.bias", (vocab,))],
                  (rows, vocab))
    b.graph.outputs["mlm_logits"] = logits
    b.cross_entropy(logits, labels)
    b.graph.optimizer = default_optimizer("adamw")
    return b.graph


def predict(profile_name: str = "wse2", execution_mode: str = "pipelined") -> CompileResult:
    """Compile BERT-Large for training; the result's ``cost`` holds the estimate."""
    return compile_graph(bert_large_graph(), mode="train", profile_name=profile_name,
                         execution_mode=execution_mode)


# --- the calibration set: published training runs on one CS-2 ------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "device", "README.md")
FRAMEWORKS = ("pytorch", "tf")
UNITS = ("samples/s", "tokens/s")
PROFILE = "wse2"  # every point ran on one CS-2

# the repositories the figures were read from (ALCF's AI testbed guides and training material)
USER_GUIDES = "argonne-lcf/user-guides@{}:docs/ai-testbed/cerebras/example-programs.md"
TRAINING_SERIES = "argonne-lcf/ai-science-training-series@{}:07_ AITestbeds/Cerebras/{}"
SC22_TUTORIAL = "argonne-lcf/AIaccelerators-SC22-tutorial@a1173356aa1aef0f6c38d63cb4d9c33152601e85:cerebras/readme.md"


@dataclass(frozen=True)
class PublishedRun:
    """One training run on one CS-2 as its log printed it, and the zoo config of its shape."""

    name: str
    family: str  # the model, as published
    framework: str  # the vendor's framework of the run: pytorch or tf
    batch_size: int  # sequences per step, as the run's config or log gives it
    max_sequence_length: int
    precision: str  # the 16-bit compute format of the vendor's mixed_precision at that release
    execution_mode: str  # pipelined (layer pipelined) or weight_streaming
    release: str  # the vendor's software release
    published: float  # the figure, in ``unit``
    unit: str  # one of UNITS
    source: str  # owner/repo@commit:path, or a URL
    quote: str  # the log line the figure is read from
    folder: str | None  # the zoo folder of the shape, twinned as pytorch/<folder> and tf/<folder>; None: none yet
    config: str | None  # a file of <folder>/configs/
    overrides: tuple[str, ...] = ()  # section.key=value, as run.py takes them: the shape the config lacks
    note: str = ""  # what else the source says that bears on the figure


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        name="bert_large_msl128_pt_r1.7.1", family="BERT-Large", framework="pytorch", batch_size=1024,
        max_sequence_length=128, precision="float16", execution_mode="pipelined", release="R1.7.1",
        published=7022.97, unit="samples/s",
        source=USER_GUIDES.format("caef19e8f0d383c200023ec0b8032ad2339eb9c5"),
        quote="2023-03-24 23:04:19,437 INFO:   | Train Device=xla:0, Step=1000, Loss=8.01562, "
              "Rate=7637.03 samples/sec, GlobalRate=7022.97 samples/sec",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=1024", "mixed_precision.dtype=float16", "device.execution_mode=pipelined"),
        note="GlobalRate at step 1000; the 100-step rates swing 6,373-8,587; batch 1024 from "
             "'Completed 1024000 sample(s)' over 1000 steps"),
    PublishedRun(
        name="bert_large_msl128_pt_r1.8.0", family="BERT-Large", framework="pytorch", batch_size=1024,
        max_sequence_length=128, precision="float16", execution_mode="pipelined", release="R1.8.0",
        published=6493.27, unit="samples/s",
        source=USER_GUIDES.format("ba5479692e5d15fe2fc6cdd73003242496a2f5a6"),
        quote="2023-05-17 18:17:26,977 INFO:   | Train Device=xla:0, Step=1000, Loss=7.90234, "
              "Rate=7454.38 samples/sec, GlobalRate=6493.27 samples/sec",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=1024", "mixed_precision.dtype=float16", "device.execution_mode=pipelined"),
        note="GlobalRate at step 1000; a run of 2023-05-15 on the same release gave 6,517.66"),
    PublishedRun(
        name="bert_large_msl128_tf_r1.7.1", family="BERT-Large", framework="tf", batch_size=1024,
        max_sequence_length=128, precision="float16", execution_mode="pipelined", release="R1.7.1",
        published=6370.0, unit="samples/s",
        source=USER_GUIDES.format("caef19e8f0d383c200023ec0b8032ad2339eb9c5"),
        quote="INFO:root:Training complete. Completed 1024000 sample(s) in 160.75317454338074 seconds",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=1024", "mixed_precision.dtype=float16", "device.execution_mode=pipelined"),
        note="samples over seconds of the whole 1000-step run (TF logs steps/sec: 5.6-6.48 a window)"),
    PublishedRun(
        name="bert_large_msl128_b256_tf_r1.8.0", family="BERT-Large", framework="tf", batch_size=256,
        max_sequence_length=128, precision="float16", execution_mode="pipelined", release="R1.8.0",
        published=6052.1, unit="samples/s",
        source=USER_GUIDES.format("ba5479692e5d15fe2fc6cdd73003242496a2f5a6"),
        quote="INFO:root:Training complete. Completed 256000 sample(s) in 42.299458026885986 seconds",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=256", "mixed_precision.dtype=float16", "device.execution_mode=pipelined"),
        note="samples over seconds of the whole 1000-step run; batch 256 from 256000 samples in 1000 steps"),
    PublishedRun(
        name="bert_large_msl128_b256_tf_r1.5", family="BERT-Large", framework="tf", batch_size=256,
        max_sequence_length=128, precision="float16", execution_mode="pipelined", release="R1.5",
        published=6888.4, unit="samples/s", source=SC22_TUTORIAL,
        quote="INFO:tensorflow:Training finished with 256000 samples in 37.164 seconds, 6888.4 samples/second.",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=256", "mixed_precision.dtype=float16", "device.execution_mode=pipelined"),
        note="SC22 tutorial, November 2022, one CS-2 (srun --gres=cs:cerebras:1); the config beside it sets "
             "use_vsl: True (variable sequence length, buckets 39-108 tokens), so the wafer worked on fewer "
             "than 128 tokens a sample; the release is the testbed's then (its guide's ~/R1.5), the log names none"),
    PublishedRun(
        name="bert_large_msl128_ws_pt_r2.0.3", family="BERT-Large", framework="pytorch", batch_size=1024,
        max_sequence_length=128, precision="float16", execution_mode="weight_streaming", release="R2.0.3",
        published=4047.95, unit="samples/s",
        source=USER_GUIDES.format("a8a674de133814ec84f00937af4b356c1c5aab78"),
        quote="2023-11-29 20:12:02,285 INFO:   | Train Device=CSX, Step=1000, Loss=7.12500, "
              "Rate=4071.60 samples/sec, GlobalRate=4047.95 samples/sec",
        folder="bert", config="bert_large_msl128.yaml",
        overrides=("train_input.batch_size=1024", "mixed_precision.dtype=float16",
                   "device.execution_mode=weight_streaming"),
        note="release 2.0's PyTorch runs weight-streamed ('run.py CSX', no pipeline option); the same command "
             "published on 2024-03-14 (ai-science-training-series@fc2a8b76, bert-large.md) gave 1,112.94, its "
             "100-step rates swinging 930-1,394: left out"),
    PublishedRun(
        name="gpt2_small_msl2048_ws_pt_r2.0.3", family="GPT-2 small", framework="pytorch", batch_size=112,
        max_sequence_length=2048, precision="float16", execution_mode="weight_streaming", release="R2.0.3",
        published=494.15, unit="samples/s",
        source=TRAINING_SERIES.format("fc2a8b768d7a05d6a77ce17439a388463486235f", "gpt2.md"),
        quote="2024-03-14 04:23:26,729 INFO:   | Train Device=CSX, Step=10000, Loss=3.43750, "
              "Rate=493.93 samples/sec, GlobalRate=494.15 samples/sec",
        folder="gpt2", config="gpt2_small_msl2048.yaml",
        overrides=("mixed_precision.dtype=float16",),
        note="'Effective batch size is 112', 'Preparing to execute using 1 CSX'; the vendor's "
             "params_gpt2_small.yaml (max_position_embeddings 2048, OWT data train_8M_msl2048)"),
    PublishedRun(
        name="gptj_6b_msl2048_ws_pt_r1.9.2", family="GPT-J 6B", framework="pytorch", batch_size=66,
        max_sequence_length=2048, precision="float16", execution_mode="weight_streaming", release="R1.9.2",
        published=19.80, unit="samples/s",
        source=TRAINING_SERIES.format("548f22f1429c99f889c8c6255a941b62a76fbc97", "gpt-j.md"),
        quote="2023-11-10 20:45:49,090 INFO:   | Train Device=xla:0, Step=200, Loss=8.37500, "
              "Rate=19.80 samples/sec, GlobalRate=19.80 samples/sec",
        folder="gpt2", config="gptj_6b.yaml",
        overrides=("train_input.batch_size=66", "mixed_precision.dtype=float16",
                   "device.execution_mode=weight_streaming"),
        note="batch 66 from 'Processed 13200 sample(s)' in 200 steps; no --num_csx (one system); the release "
             "from its --python_paths (~/R_1.9.2); the vendor's GPT-J config trains at MSL 2048; the zoo's "
             "gptj_6b has attention biases and vocab 50400 (6.05 B weights)"),
    PublishedRun(
        name="llama_7b_msl2048_ws_pt_r2.1.1", family="LLaMA-7B", framework="pytorch", batch_size=99,
        max_sequence_length=2048, precision="float16", execution_mode="weight_streaming", release="R2.1.1",
        published=20.45, unit="samples/s",
        source=USER_GUIDES.format("8570ee46bbec43871ffac2d2eb08d3b6ad98cdca"),
        quote="2024-03-21 17:50:50,110 INFO:   | Train Device=CSX, Step=1600, Loss=5.85938, "
              "Rate=20.44 samples/sec, GlobalRate=20.45 samples/sec",
        folder="llama", config="llama2_7b.yaml",
        overrides=("train_input.data_dir=./data/llama_msl2048", "train_input.max_sequence_length=2048",
                   "train_input.batch_size=99", "model.max_position_embeddings=2048", "model.rms_norm_eps=1.0e-6",
                   "mixed_precision.dtype=float16", "device.execution_mode=weight_streaming"),
        note="'Effective batch size is 99', 'using 1 CSX', 'No benefit from gradient accumulation expected': "
             "one pass of 99; the vendor's params_llama_7b.yaml (LLaMA 1 7B: MSL 2048, RMS eps 1e-6, vocab "
             "32000) is Llama 2 7B's shape at MSL 2048"),
)


@dataclass(frozen=True)
class Outcome:
    """One point's compile: the estimate (samples/s), or why there is none."""

    samples_per_s: float | None = None
    seconds: float = 0.0  # wall time of the compile's process
    peak_bytes: int = 0  # its peak resident memory
    error: str = ""  # the compile's last error line, or why nothing was compiled


def estimate_in_unit(point: PublishedRun, samples_per_s: float) -> float:
    """The estimate in the unit of the published figure."""
    return samples_per_s * point.max_sequence_length if point.unit == "tokens/s" else samples_per_s


def compile_command(point: PublishedRun, framework: str, model_dir: str) -> list[str]:
    """run.py --compile_only of the point's config in ``framework``'s twin of its folder, on one CS-2."""
    folder = os.path.join(framework, point.folder)
    return [sys.executable, os.path.join(folder, "run.py"), "--params", os.path.join(folder, "configs", point.config),
            "--compile_only", "--model_dir", model_dir, *point.overrides, f"device.profile={PROFILE}"]


def compile_point(point: PublishedRun, framework: str) -> Outcome:
    """Compile the point in its own process (from the repository root, as the READMEs' commands run)."""
    if point.folder is None:
        return Outcome(error="no zoo folder")
    with tempfile.TemporaryDirectory(prefix="calibration_") as model_dir, \
            tempfile.TemporaryFile("w+") as log:
        started = time.perf_counter()
        process = subprocess.Popen(compile_command(point, framework, model_dir), cwd=ROOT, stdout=log,
                                   stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this process's own peak memory, not the largest so far
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        peak = usage.ru_maxrss * 1024  # KiB on Linux
        report = os.path.join(model_dir, "compile", "report.json")
        if process.returncode != 0 or not os.path.exists(report):
            log.seek(0)
            lines = [line.strip() for line in log.read().splitlines() if line.strip()]
            return Outcome(seconds=seconds, peak_bytes=peak,
                           error=lines[-1] if lines else f"exit status {process.returncode}")
        with open(report) as f:
            samples = json.load(f)["performance"]["samples_per_s"]
    return Outcome(samples_per_s=samples, seconds=seconds, peak_bytes=peak)


def markdown_table(rows: list[tuple[PublishedRun, Outcome]], framework: str) -> str:
    """The comparison, one row per point, in the order given."""
    lines = [f"| point | model | published run | batch | MSL | mode | estimate ({framework}, wse2) | published "
             f"| estimate / published | compile s | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for point, outcome in rows:
        run = f"{point.framework} {point.release} {point.precision}"
        mode = point.execution_mode.replace("_", " ")
        published = f"{point.published:,.{_decimals(point.published)}f} {point.unit}"
        if outcome.samples_per_s is None:
            estimate, ratio = outcome.error.replace("|", "/"), "-"
        else:
            value = estimate_in_unit(point, outcome.samples_per_s)
            estimate, ratio = f"{value:,.{_decimals(value)}f} {point.unit}", f"{value / point.published:.2f}"
        seconds = f"{outcome.seconds:.0f}" if outcome.seconds else "-"
        peak = f"{outcome.peak_bytes / 2**30:.1f}" if outcome.peak_bytes else "-"
        lines.append(f"| {point.name} | {point.family} | {run} | {point.batch_size} | {point.max_sequence_length} "
                     f"| {mode} | {estimate} | {published} | {ratio} | {seconds} | {peak} |")
    return "\n".join(lines)


def _decimals(value: float) -> int:
    """Whole numbers from 100 up, two decimals below (GPT-J's 19.80 samples/s)."""
    return 0 if abs(value) >= 100 else 2


def readme_markers(framework: str) -> tuple[str, str]:
    return (f"<!-- calibration table, {framework}: generated by python -m device.calibration "
            f"--framework {framework} --write-readme -->", f"<!-- end of calibration table, {framework} -->")


def write_readme(table: str, framework: str, path: str = README) -> None:
    """Replace the text between the framework's markers of ``path`` with ``table``."""
    begin, end = readme_markers(framework)
    with open(path) as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1:
        raise UserError(f"{path} must hold the {framework} calibration table's markers once each "
                        f"({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{table}\n{end}{tail}")


def select(names: list[str] | None) -> tuple[PublishedRun, ...]:
    """The points named (all when ``names`` is empty), in the set's order; an unknown name is refused."""
    if not names:
        return PUBLISHED_RUNS
    known = {point.name for point in PUBLISHED_RUNS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(f"--point {unknown[0]!r} is no point of the calibration set; its points: {', '.join(known)}")
    return tuple(point for point in PUBLISHED_RUNS if point.name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m device.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                        help="which twin of each point's folder compiles it (default: pytorch)")
    parser.add_argument("--point", action="append", metavar="NAME", help="compile only this point (repeatable)")
    parser.add_argument("--write-readme", action="store_true",
                        help=f"write the table into {os.path.relpath(README, ROOT)} (every point only)")
    args = parser.parse_args(argv)
    try:
        if args.write_readme and args.point:
            raise UserError("--write-readme writes the whole set's table: drop --point")
        rows = []
        for point in select(args.point):
            outcome = compile_point(point, args.framework)
            print(f"{point.name}: {outcome.samples_per_s if outcome.error == '' else outcome.error} "
                  f"({outcome.seconds:.0f} s)", file=sys.stderr, flush=True)
            rows.append((point, outcome))
        table = markdown_table(rows, args.framework)
        print(table)
        if args.write_readme:
            write_readme(table, args.framework)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0 if all(outcome.samples_per_s is not None or point.folder is None for point, outcome in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

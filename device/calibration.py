"""Calibration of the cost model against the one published figure we have.

wafer-facts.md: BERT-Large, sequence length 128, batch 1024, layer-pipelined on one
CS-2 (R1.7 software): about 6,400 samples/s. ``bert_large_graph`` builds that model's
training graph by hand from IR ops; ``predict`` runs it through match -> place -> cost
on the wse2 profile. Nothing here is tuned to the figure: the ratio predicted/observed
is reported as it comes out (benchmarks/cost_calibration.py prints it).

Simplifications, each keeping the work and memory of the real model:
- the attention mask arrives as an additive (B, 1, 1, T) input, computed on the host;
- the masked-LM head runs on the first ``max_predictions`` positions of each sequence,
  a stand-in with the same shapes as gathering the 20 masked positions (BERT's
  pretraining setting for T = 128); the decoder is tied to the word embeddings;
- no next-sentence head (a 1024 x 2 dense layer on one token: negligible).
"""

from __future__ import annotations

from device.api import CompileResult, compile_graph
from device.graphs import GraphBuilder, attention_block, default_optimizer, layer_norm
from device.ir import Graph

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

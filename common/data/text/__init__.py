"""Text data for the language models: corpora, tokenizers, pretraining and sequence-to-sequence examples.

- ``corpus``: the default corpus (Python's documentation prose, shipped with CPython) and
  readers of text files and JSON lines; standard library only.
- ``tokenizer``: WordPiece and byte-level BPE trained with Hugging Face ``tokenizers``,
  and readers of vocab.txt, GPT-2's encoder.json + vocab.bpe and tokenizer.json.
- ``pretraining``: Google BERT's masked-LM + next-sentence examples; HDF5 files (h5py).
- ``prepare``: what ``datasets/prepare_bert.py`` runs (sharded, restartable).
- ``lm``: GPT-2 language-model data (packed next-token windows): ``datasets/prepare_gpt2.py``'s work and its readers.
- ``seq2seq``: encoder-decoder data (Transformer, T5): parallel text files as WMT ships
  them, the word-reversal task from the default corpus (one right answer per example),
  T5's span corruption, and the fixed-length encoder/decoder arrays.
- ``tfrecord``: the TFRecord writer and the tf.data reader (imports TensorFlow).
- ``torch_dataset``: the torch Dataset over the HDF5 shards (imports torch).
- ``classification``: sentence (pair) classification tasks for fine-tuning: a task from
  the default corpus with true labels, GLUE SST-2 and MNLI readers, and their encoding.

Only ``corpus`` is imported here, so ``import common.data.text`` needs neither a
framework nor ``tokenizers``; import the other modules by name.
"""

from common.data.text.corpus import (
    corpus_fingerprint,
    default_corpus,
    read_corpus,
    read_jsonl,
    read_text_file,
    split_sentences,
)

__all__ = ["corpus_fingerprint", "default_corpus", "read_corpus", "read_jsonl", "read_text_file", "split_sentences"]

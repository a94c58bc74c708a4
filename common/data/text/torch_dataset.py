"""BERT pretraining examples from HDF5 shards as a torch Dataset (the PyTorch side's reader)."""

import bisect

import numpy as np
import torch

from common.data.text.pretraining import FEATURES, read_hdf5
from common.errors import UserError


class PretrainingHDF5Dataset(torch.utils.data.Dataset):
    """Every example of the HDF5 files ``paths``, in file order; item k is a dict of tensors.

    All files are read and schema-checked when the dataset is made (a shard of the default
    corpus is a few MB), so a wrong file stops with one line naming it and the field.
    ids are int64 (torch's index type), masked_lm_weights float32, next_sentence_labels a
    scalar per example.
    """

    def __init__(self, paths, max_seq_length=None, max_predictions_per_seq=None):
        paths = [str(p) for p in paths]
        if not paths:
            raise UserError("no HDF5 file given")
        self.shards = []
        for p in paths:
            arrays = read_hdf5(p, max_seq_length, max_predictions_per_seq)
            max_seq_length = arrays["input_ids"].shape[1]
            max_predictions_per_seq = arrays["masked_lm_positions"].shape[1]
            self.shards.append({
                name: torch.from_numpy(a.astype(np.float32 if dtype == "float32" else np.int64))
                for name, a in arrays.items() for dtype in [FEATURES[name][0]]
            })
        self.max_seq_length, self.max_predictions_per_seq = max_seq_length, max_predictions_per_seq
        self.ends = np.cumsum([s["input_ids"].shape[0] for s in self.shards]).tolist()

    def __len__(self):
        return self.ends[-1]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = bisect.bisect_right(self.ends, index)
        k = index - (self.ends[s - 1] if s else 0)
        item = {name: t[k] for name, t in self.shards[s].items()}
        item["next_sentence_labels"] = item["next_sentence_labels"][0]
        return item

"""A token tagger (NER-style) trained on a CSV fetched from the web."""
import csv
import os
import urllib.request

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

DATA_URL = "https://example.org/datasets/ner_sentences.csv"
NUM_TAGS = 9
PAD_TAG = -100

if not os.path.exists("ner_sentences.csv"):
    urllib.request.urlretrieve(DATA_URL, "ner_sentences.csv")


class Sentences(Dataset):
    def __init__(self, path, vocab):
        with open(path) as f:
            rows = list(csv.reader(f))
        self.items = [([vocab.setdefault(w, len(vocab)) for w in r[0].split()], [int(t) for t in r[1].split()])
                      for r in rows]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        words, tags = self.items[i]
        return torch.tensor(words), torch.tensor(tags)


def collate(batch):
    words = pad_sequence([b[0] for b in batch], batch_first=True, padding_value=0)
    tags = pad_sequence([b[1] for b in batch], batch_first=True, padding_value=PAD_TAG)
    return words, tags


class Tagger(nn.Module):
    def __init__(self, vocab_size, dim, num_tags):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, num_tags)

    def forward(self, words, tags=None):
        logits = self.out(torch.relu(self.hidden(self.embed(words))))  # (B, T, num_tags)
        if tags is None:
            return logits
        keep = tags != PAD_TAG
        return F.cross_entropy(logits[keep], tags[keep])


vocab = {"<pad>": 0}
data = Sentences("ner_sentences.csv", vocab)
loader = DataLoader(data, batch_size=32, shuffle=True, collate_fn=collate, drop_last=True)
model = Tagger(len(vocab), 128, NUM_TAGS)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)

for epoch in range(5):
    for words, tags in loader:
        loss = model(words, tags)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

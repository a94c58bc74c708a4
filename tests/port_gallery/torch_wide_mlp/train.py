"""A wide MLP on precomputed 2048-d image embeddings (features saved by another job)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

EMBED_DIM = 2048
HIDDEN = 4096
CLASSES = 1000


class WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(EMBED_DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                                 nn.Linear(HIDDEN, CLASSES))

    def forward(self, x):
        return self.net(x)


def main():
    features = torch.load("embeddings/train_features.pt")
    labels = torch.load("embeddings/train_labels.pt")
    loader = DataLoader(TensorDataset(features, labels), batch_size=256, shuffle=True, drop_last=True)
    model = WideMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(10):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()

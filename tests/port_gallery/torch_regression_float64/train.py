"""Fit a small MLP to a synthetic regression problem, numpy data straight into torch."""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

N_SAMPLES = 5000
N_FEATURES = 13
HIDDEN = 64

rng = np.random.default_rng(0)
X = np.random.rand(N_SAMPLES, N_FEATURES)
w = np.random.rand(N_FEATURES, 1)
y = X @ w + 0.1 * np.random.randn(N_SAMPLES, 1)

dataset = TensorDataset(torch.from_numpy(X), torch.from_numpy(y))
loader = DataLoader(dataset, batch_size=64, shuffle=True)

model = nn.Sequential(nn.Linear(N_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)).double()
criterion = nn.MSELoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(50):
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(xb)
    print(f"epoch {epoch}: mse {total / N_SAMPLES:.4f}")

"""Train, then evaluate at each epoch's end: the evaluation (no_grad, the validation loader) is the host's."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

train_loader = DataLoader(TensorDataset(torch.randn(640, 20), torch.randint(0, 3, (640,))), batch_size=64,
                          drop_last=True)
val_loader = DataLoader(TensorDataset(torch.randn(128, 20), torch.randint(0, 3, (128,))), batch_size=64,
                        drop_last=True)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(5):
    model.train()
    for x, y in train_loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    correct = 0
    for x, y in val_loader:
        correct += (model(x).argmax(1) == y).sum().item()
    with torch.no_grad():
        top2 = model(torch.randn(4, 20)).topk(2).indices
    print(epoch, correct / 128, top2)

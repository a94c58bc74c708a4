"""CIFAR-10 with a small CNN that keeps the k strongest channels: a torchvision-style script."""
import os

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.utils.tensorboard import SummaryWriter

DATA_ROOT = os.path.expanduser("~/data/cifar10")
BATCH_SIZE = 128
EPOCHS = 30
LR = 0.05
TOP_K = 8


class TopKPool(nn.Module):
    """Keeps the k largest activations of each channel map and averages them."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):  # (B, C, H, W) -> (B, C)
        flat = x.flatten(2)
        values, _ = flat.topk(self.k, dim=2)
        return values.mean(dim=2)


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10, k=TOP_K):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.pool = TopKPool(k)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.pool(self.features(x)))


def main():
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))])
    train_set = torchvision.datasets.CIFAR10(DATA_ROOT, train=True, transform=transform)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, num_workers=4,
                                               drop_last=True)

    model = SmallCNN().cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    writer = SummaryWriter("runs/cifar")

    step = 0
    for epoch in range(EPOCHS):
        for images, labels in train_loader:
            images, labels = images.cuda(), labels.cuda()
            logits = model(images)
            loss = criterion(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            acc = (logits.argmax(dim=1) == labels).float().mean()
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalar("train/accuracy", acc.item(), step)
            step += 1
    torch.save(model.state_dict(), "cifar_cnn.pt")


if __name__ == "__main__":
    main()

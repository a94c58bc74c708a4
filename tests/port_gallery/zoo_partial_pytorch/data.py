"""Fashion-MNIST DataLoaders."""
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def get_train_dataloader(params):
    p = params["train_input"]
    dataset = datasets.FashionMNIST(p["data_dir"], train=True, download=True, transform=transforms.ToTensor())
    return DataLoader(dataset, batch_size=p["batch_size"], shuffle=True)

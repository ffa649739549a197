#!/usr/bin/env python3
"""PyTorch's official MNIST example (pytorch/examples, mnist/main.py), as the seed benchmark ran
it: Dropout2d after the pool, Adadelta, StepLR, torchvision-style ToTensor + Normalize, a
DataLoader with shuffling. Differences: images are read from IDX files (ember's committed
data/mnist) instead of torchvision's download, so torchvision is not needed; the
loader is a TensorDataset over the normalised images; CPU unless --accel.

    ~/torch-venv/bin/python benches/pytorch/mnist_example.py --epochs 1 --save-model
    ember import --from pytorch mnist_cnn.pt --model pytorch-example --out runs/imported
    ember eval --checkpoint runs/imported
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR

from models import PytorchExampleNet, load_split


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if args.log_interval and batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.2f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
    return test_loss, correct


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--test-batch-size', type=int, default=1000)
    parser.add_argument('--epochs', type=int, default=14)
    parser.add_argument('--lr', type=float, default=1.0)
    parser.add_argument('--gamma', type=float, default=0.7)
    parser.add_argument('--accel', action='store_true', help='use CUDA if available')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--log-interval', type=int, default=10)
    parser.add_argument('--save-model', action='store_true')
    parser.add_argument('--data-dir', default='data/mnist')
    parser.add_argument('--threads', type=int, default=None, help='torch.set_num_threads')
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    use_cuda = args.accel and torch.cuda.is_available()
    device = torch.device('cuda' if use_cuda else 'cpu')
    train_kwargs = {'batch_size': args.batch_size, 'shuffle': True}
    test_kwargs = {'batch_size': args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {'num_workers': 1, 'pin_memory': True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    mean, std = 0.1307, 0.3081
    train_set = torch.utils.data.TensorDataset(*load_split(args.data_dir, 'train', mean, std))
    test_set = torch.utils.data.TensorDataset(*load_split(args.data_dir, 'test', mean, std))
    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs)

    model = PytorchExampleNet().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        train(args, model, device, train_loader, optimizer, epoch)
        print(f'epoch {epoch} train time {time.perf_counter() - start:.1f} s')
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), 'mnist_cnn.pt')
        print('saved mnist_cnn.pt')


if __name__ == '__main__':
    main()

"""The hand-written job `scalelab bench startup` times `scalelab train` against: what a researcher
writes without scalelab, and it imports nothing from it.

    OMP_NUM_THREADS=1 MLFLOW_TRACKING_URI=sqlite:///mlflow.db \
        torchrun --standalone --nproc-per-node 2 benchmarks/handwritten_ddp.py --data train.pt

The default `train` job of params.yaml, by hand: the training split of scikit-learn's digits as one
tensor file (`--data`: {"x": float32 [n, 64], "y": int64 [n]}, made by the benchmark beforehand, as
`prepare` makes its files), DistributedSampler, the MLP (64 -> 256 -> 256 -> 10, dropout 0.1:
`--hidden`, `--dropout`), AdamW at lr 0.003, batch 32 per rank, DDP over gloo. Rank 0 logs the
params and, every 10 steps, the loss to MLflow. Rank 0 prints `first_step_at <epoch seconds>`
after its first step.
"""

import argparse
import time

import mlflow
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True, help="the training split: a torch file of x and y")
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.003)
parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
parser.add_argument("--dropout", type=float, default=0.1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
split = torch.load(args.data)
data = TensorDataset(split["x"], split["y"])
sampler = DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
layers, width = [], data.tensors[0].shape[1]
for hidden in args.hidden:
    layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(args.dropout)]
    width = hidden
model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(width, 10)))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
if rank == 0:
    mlflow.set_experiment("handwritten")
    mlflow.start_run(run_name="handwritten-ddp")
    mlflow.log_params({**vars(args), "world_size": dist.get_world_size()})
step = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == 1 and rank == 0:
            print(f"first_step_at {time.time()}", flush=True)
        if step % 10 == 0 and rank == 0:
            mlflow.log_metric("train_loss", loss.item(), step=step)
if rank == 0:
    mlflow.end_run()
    print(f"steps {step}", flush=True)
dist.destroy_process_group()

"""What drawing the user's dropout masks costs under channels_last.

A CNN with `nn.Dropout` on its 4-D feature maps (3 convolutions, 32x32 inputs, batch 32) under
`optimize(channels_last=True, amp=False, compile=False)`, once as autoopt runs it (the dropout
modules get their NHWC input in NCHW, so they draw the masks the user's NCHW loop draws) and
once with that pre-hook removed (masks drawn in NHWC order: other numbers at the same seed).
Both models alternate in rounds of 5 steps after 5 warm-up steps, one torch thread; medians of
15 rounds of wall and CPU time per step, and the ratio hooked / unhooked.

    python -m benchmarks.channels_last_dropout
"""

import statistics
import time

import torch
from torch import nn

import autoopt

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def build(hooked):
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    m, opt = autoopt.optimize(
        m, optimizer=opt, amp=False, channels_last=True, compile=False, verbose=False
    )
    if not hooked:
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod._forward_pre_hooks.clear()
    return m, opt


x = torch.randn(32, 3, 32, 32)
y = torch.randint(0, 10, (32,))
runs = {True: build(True), False: build(False)}


def step(m, opt):
    opt.zero_grad()
    nn.functional.cross_entropy(m(x), y).backward()
    opt.step()


for m, opt in runs.values():
    for _ in range(5):
        step(m, opt)
res = {True: ([], []), False: ([], [])}
for _ in range(15):
    for hooked in (True, False):
        m, opt = runs[hooked]
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(5):
            step(m, opt)
        res[hooked][0].append((time.perf_counter() - w0) / 5)
        res[hooked][1].append((time.process_time() - c0) / 5)
for hooked in (True, False):
    w, c = res[hooked]
    print(
        f"hooked={hooked}: wall {statistics.median(w) * 1e3:.1f} ms (IQR {statistics.quantiles(w)[0] * 1e3:.1f}-{statistics.quantiles(w)[2] * 1e3:.1f}), cpu {statistics.median(c) * 1e3:.1f} ms"
    )
wall_ratio = statistics.median(res[True][0]) / statistics.median(res[False][0])
cpu_ratio = statistics.median(res[True][1]) / statistics.median(res[False][1])
print(f"ratio hooked/unhooked wall {wall_ratio:.3f} cpu {cpu_ratio:.3f}")

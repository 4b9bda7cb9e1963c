"""AO103: per-batch `.to(device)` that waits for the copy to finish."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.facts import EVAL_MARKERS
from autoopt.lint.program.handled import is_hogwild, library_places_batches
from autoopt.lint.program.loops import (
    batch_names,
    batch_transfers,
    data_loops,
    prefetcher_fallback,
    read_on_host_later,
)
from autoopt.lint.program.project_facts import own_to_classes
from autoopt.lint.rewrite.fixes.preconditions import batch_of_tensors
from autoopt.lint.tree.calls import arg, with_keyword
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    method_name,
    names_in,
    nodes_of_type,
    root_name,
)

_TORCHTEXT_ITERATORS = ("BucketIterator", "BPTTIterator", "torchtext.data.Iterator")


def _builds_torchtext_iterators(text: str) -> bool:
    return "torchtext" in text and any(name in text for name in _TORCHTEXT_ITERATORS)


_UNPROVEN = (
    "the batch does not come from a DataLoader of this file with the default collate, so it "
    "may be the project's own batch class, whose .to() may not take non_blocking"
)


class ToDeviceNonBlocking(Rule):
    """
    ## What it does
    Flags `batch.to(device)` and `batch.cuda()` inside the loop over a DataLoader (also a
    training loop that pulls batches with `next(data_iter)` (or the old iterator's
    `data_iter.next()`), from a generator that re-iterates the loader too, and a comprehension over the batch) when it
    does not pass `non_blocking=True`, and the legacy form of the same copy, `imgs.type(Tensor)` with
    `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`. A training loop that
    hands its batch to a function or method of the project that makes the blocking copy
    (KAIR's `model.feed_data(train_data)` doing `data["L"].to(self.device)`) is reported at
    that call, without a fix (the copy is written elsewhere). A loop whose backward runs in
    code that cannot be resolved counts as training when it zeroes and steps an optimizer.

    ## Why
    A blocking host-to-device copy makes the Python thread wait for the transfer before it can
    queue the forward pass. With `non_blocking=True` (and a pinned batch, AO102) the copy is
    queued on the stream like a kernel and the CPU moves on; the GPU orders it before the kernels
    that read it, so results are identical (as widely read PyTorch tutorials teach).

    ## When not to
    - A batch not proven to be tensors in a project that defines its own `.to()` without
      `non_blocking` (detr's `NestedTensor.to(device)`): the batch may be one (not reported).
    - Evaluation loops of a file whose training loop already passes `non_blocking`: the
      author chose where to overlap (not reported).
    - Only tensors that come from the loader's batch are flagged (the loop's targets and what is
      unpacked or indexed from them, also in a step function of the file the batch is handed
      to: GwcNet's `train_sample(sample)` copying `sample["left"]`): not `.to()` of a module, not
      a dtype cast (`.to(torch.float16)`), not `.to("cpu")` (a device-to-host copy read right
      away on the host would race), not a tensor made on the host in the loop
      (`torch.from_numpy(...)`, `torch.tensor(...)`: pageable memory, where `non_blocking`
      copies synchronously all the same; VideoPose3D).
    - Not in a loop where some copy already passes `non_blocking` (`imgs.to(device,
      non_blocking=True)` beside a small `targets.to(device)`): the author chose which copies
      overlap. The fix therefore changes all of a loop's copies at once.
    - Not the fallback copy of a script with its own prefetcher (under
      `if not args.prefetcher:`, timm's train.py): by default batches arrive on the device
      already, copied ahead on a side stream.
    - Not when the moved tensor is read on the host later in the same block (`.item()`,
      `.tolist()`, `.numpy()`, `print`) on every step: that read waits for the copy anyway (a
      read under an `if`, logging now and then, does not count). So does an `if` that tests
      its values (`if batch.batch[-1] == 0:`, not its shape), a read in the `else` of an `if`
      that only skips (`if odd: pass` / `else:` the step), a host read of what consumes the
      copy in the same statement (`model(x, e.to(device)).cpu()`), and a helper of the project
      that it is handed to and that reads on the host (DnCNN's `batch_PSNR(out, img)`). A
      part of the moved batch counts as the batch (`inputs, labels = data_batch`, then
      `labels[mask].cpu()`).
    - Not in scripts with no GPU path (no CUDA, `torch.accelerator`, device flag or device
      parameter anywhere; see `autoopt.lint.program.device`), where there is nothing to overlap.
    - Not when a library places the batches (`accelerator.prepare(loader)` of HF Accelerate,
      Lightning), nor in Hogwild training (`model.share_memory()` and CPU worker processes,
      also when this file is the module such a script starts).

    ## Fix (safe)
    Adds `non_blocking=True` (`Tensor.type` takes it too). CUDA orders the copy before every
    later use on the same stream. Safe where the batch is proven to hold tensors: the loop
    iterates a `torch.utils.data.DataLoader` built in the file with the default collate.
    Elsewhere (a loader passed in, a custom `collate_fn`) the batch may be the project's own
    class (DETR's `NestedTensor`), whose `.to()` may not take `non_blocking`: the fix is then
    unsafe.
    """

    code = "AO103"
    name = "to-device-non-blocking"
    message = "per-batch .to(device) blocks until the copy is done; pass non_blocking=True"
    fix_safety = FixSafety.SAFE
    fix_reason = "the stream orders the asynchronous copy before every kernel that reads it"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = (".to(", ".type(", ".cuda(", "DataLoader", "loader")  # a callee may copy
    # Only in batch loops (loops.data_loops): training loops, evaluation loops (AO403's
    # markers) or loops over a DataLoader. CUDA-only, but a training helper may name no GPU
    # (`x.to(rank)`) where its importer does: `program.gpu_path` decides, not the text.
    requires = ((".backward(", "DataLoader", *EVAL_MARKERS),)

    VALID = [
        Valid(  # a tensor made on the host from numpy in the loop: pageable, no loader pinned it
            """
            import torch
            for cam, batch in generator.next_epoch():
                cam = torch.from_numpy(cam.astype("float32"))
                inputs = torch.from_numpy(batch.astype("float32"))
                if torch.cuda.is_available():
                    cam = cam.cuda()
                    inputs = inputs.cuda()
                loss = model(inputs, cam).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a module and a dtype cast, not the batch
            """
            import torch
            model = Net().to("cuda")
            for x, y in loader:
                x = x.to(torch.float16)
                loss = model(x).sum()
                loss.backward()
            """
        ),
        Valid(  # read on the host right after
            """
            import torch
            device = torch.device("cuda")
            for x, y in loader:
                y = y.to(device)
                print(y.tolist())
                model(x).sum().backward()
            """
        ),
        Valid(  # a part of the moved batch, unpacked, read on the host every step (W2NER)
            """
            import torch
            for i, data_batch in enumerate(loader):
                data_batch = [data.cuda() for data in data_batch[:-1]]
                inputs, labels, mask = data_batch
                outputs = model(inputs, mask)
                loss = criterion(outputs[mask], labels[mask])
                loss.backward()
                labels = labels[mask].view(-1)
                label_result.append(labels.cpu())
            """
        ),
        Valid(  # the truth value of the moved batch, taken before the step (deep_gcns)
            """
            import torch
            device = torch.device("cuda")
            for batch in loader:
                batch = batch.to(device)
                if batch.batch[-1] == 0:
                    continue
                model(batch).sum().backward()
            """
        ),
        Valid(  # `if <odd batch>: pass` / `else:` the step, which reads it on the host
            """
            import torch
            device = torch.device("cuda")
            for batch in loader:
                batch = batch.to(device)
                if batch.x.shape[0] == 1:
                    pass
                else:
                    pred = model(batch)
                    y_true.append(batch.y.view(pred.shape).detach().cpu())
            """
        ),
        Valid(  # the copy's consumer is read on the host in the same statement
            """
            import torch
            device = torch.device("cuda")
            for idx in loader:
                pred = model(x, edges[idx].to(device)).cpu().detach()
                loss(pred).backward()
            """
        ),
        Valid(  # CPU-only script
            """
            import torch
            device = torch.device("cpu")
            for x, y in loader:
                x = x.to(device)
                model(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            device = "cuda"
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                model(x).sum().backward()
            """
        ),
        Valid(  # Accelerate places the batches
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for x, y in loader:
                x = x.to(accelerator.device)
                accelerator.backward(model(x).sum())
            """
        ),
        Valid(  # Hogwild: CPU processes sharing one model
            """
            import torch.multiprocessing as mp
            def train(model, device, loader):
                for x, y in loader:
                    model(x.to(device)).sum().backward()
            if __name__ == "__main__":
                model.share_memory()
                procs = [mp.Process(target=train, args=(model, device, loader)) for _ in range(4)]
            """
        ),
        Valid(  # torchtext's iterator makes the batches (keon/seq2seq): no DataLoader, no
            # pinned memory for a non-blocking copy to start from
            """
            import torch
            from torchtext.data import BucketIterator
            train_iter, val_iter = BucketIterator.splits((train, val), batch_size=32)
            for b, batch in enumerate(train_iter):
                src, len_src = batch.src
                src, trg = src.cuda(), batch.trg.cuda()
                loss = criterion(model(src, trg), trg)
                loss.backward()
            """
        ),
        Valid(  # a tensor made on the host each step is not the loader's batch
            """
            import torch
            device = torch.device("cuda")
            for i, (images, _) in enumerate(data_loader):
                labels = torch.ones(images.size(0), 1).to(device)
                loss = criterion(model(images), labels)
                loss.backward()
            """
        ),
        Valid(  # the loop already makes the copy that matters asynchronous (yolov5)
            """
            import torch
            device = torch.device("cuda")
            for i, (imgs, targets) in enumerate(train_loader):
                imgs = imgs.to(device, non_blocking=True).float() / 255
                loss = compute_loss(model(imgs), targets.to(device))
                loss.backward()
            """
        ),
        Valid(  # the script's own prefetcher copies batches ahead; this is its fallback
            """
            import torch
            device = torch.device("cuda")
            for input, target in loader:
                if not args.prefetcher:
                    input, target = input.to(device), target.to(device)
                loss = loss_fn(model(input), target)
                loss.backward()
            """
        ),
        Valid(  # not a batch loop: moving parameters
            """
            import torch
            for p in params:
                p.data = p.data.to("cuda")
            """
        ),
        Valid(  # the training loop's copies are non-blocking; evaluation's blocking on purpose
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for x, y in train_loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss_fn(model(x), y).backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                for x, y in val_loader:
                    acc = (model(x.to(device)).argmax(1) == y.to(device)).float().mean()
            """
        ),
    ]
    INVALID = [
        Invalid(  # a step function copies the entries of the batch it is handed (GwcNet)
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True)
            def train_sample(sample):
                imgL, imgR, disp = sample["left"], sample["right"], sample["disparity"]
                imgL = imgL.cuda()
                imgR = imgR.cuda()
                disp = disp.cuda()
                loss = model_loss(model(imgL, imgR), disp)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            for epoch in range(10):
                for sample in loader:
                    train_sample(sample)
            """,
            line=6,
            message_contains="3 copies",
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True)
            def train_sample(sample):
                imgL, imgR, disp = sample["left"], sample["right"], sample["disparity"]
                imgL = imgL.cuda(non_blocking=True)
                imgR = imgR.cuda(non_blocking=True)
                disp = disp.cuda(non_blocking=True)
                loss = model_loss(model(imgL, imgR), disp)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            for epoch in range(10):
                for sample in loader:
                    train_sample(sample)
            """,
        ),
        Invalid(  # the device chosen in the project's config module (pytorch-book's `opt`)
            """
            from config import opt
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=8, pin_memory=True)
            for data, label in loader:
                loss = criterion(model(data.to(opt.device)), label.to(opt.device))
                loss.backward()
            """,
            line=6,
            fixed="""
            from config import opt
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=8, pin_memory=True)
            for data, label in loader:
                loss = criterion(model(data.to(opt.device, non_blocking=True)), label.to(opt.device, non_blocking=True))
                loss.backward()
            """,
            message_contains="non_blocking",
        ),
        Invalid(  # a shape's comparison reads no value: the copy can overlap
            """
            import torch
            device = torch.device("cuda")
            for batch in loader:
                batch = batch.to(device)
                if batch.x.shape[0] == 1:
                    continue
                model(batch).sum().backward()
            """,
            line=4,
            fixed="""
            import torch
            device = torch.device("cuda")
            for batch in loader:
                batch = batch.to(device, non_blocking=True)
                if batch.x.shape[0] == 1:
                    continue
                model(batch).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the batch read on the host only now and then (to log it): still overlap
            """
            import torch
            from torch.utils.data import DataLoader

            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=8, pin_memory=True)
            for step, (data, target) in enumerate(loader):
                data, target = data.to(device), target.to(device)
                loss = model(data).sum()
                loss.backward()
                if step % 100 == 0:
                    log_images(data.cpu().numpy())
            """,
            line=7,
            fixed="""
            import torch
            from torch.utils.data import DataLoader

            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=8, pin_memory=True)
            for step, (data, target) in enumerate(loader):
                data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
                loss = model(data).sum()
                loss.backward()
                if step % 100 == 0:
                    log_images(data.cpu().numpy())
            """,
        ),
        Invalid(  # the batch is moved by a helper method the loop hands it to (Informer)
            """
            import torch
            from torch.utils.data import DataLoader
            class Exp:
                device = torch.device("cuda")
                def _process_one_batch(self, batch_x, batch_y):
                    return self.model(batch_x.float().to(self.device)), batch_y.to(self.device)
                def train(self, dataset):
                    loader = DataLoader(dataset, batch_size=32, pin_memory=True)
                    for batch_x, batch_y in loader:
                        pred, true = self._process_one_batch(batch_x, batch_y)
                        loss = (pred - true).pow(2).mean()
                        loss.backward()
            """,
            line=6,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            class Exp:
                device = torch.device("cuda")
                def _process_one_batch(self, batch_x, batch_y):
                    return self.model(batch_x.float().to(self.device, non_blocking=True)), batch_y.to(self.device, non_blocking=True)
                def train(self, dataset):
                    loader = DataLoader(dataset, batch_size=32, pin_memory=True)
                    for batch_x, batch_y in loader:
                        pred, true = self._process_one_batch(batch_x, batch_y)
                        loss = (pred - true).pow(2).mean()
                        loss.backward()
            """,
        ),
        Invalid(  # a DataLoader of this file, default collate: tensors, so the fix is safe
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss_fn(model(x), y).backward()
            """,
            line=6,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss_fn(model(x), y).backward()
            """,
        ),
        Invalid(  # DETR: a custom collate_fn yields the project's NestedTensor (unsafe fix)
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            data_loader = DataLoader(dataset_train, batch_size=2, collate_fn=utils.collate_fn)
            for samples, targets in data_loader:
                samples = samples.to(device)
                loss = criterion(model(samples), targets)
                loss.backward()
            """,
            line=6,
            message_contains="own batch class",
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            data_loader = DataLoader(dataset_train, batch_size=2, collate_fn=utils.collate_fn)
            for samples, targets in data_loader:
                samples = samples.to(device, non_blocking=True)
                loss = criterion(model(samples), targets)
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # `.cuda()` on each batch
            """
            import torch
            for images, labels in loader:
                images = images.cuda()
                labels = labels.cuda()
                loss = criterion(model(images), labels)
                loss.backward()
                optimizer.step()
            """,
            line=3,
            fixed="""
            import torch
            for images, labels in loader:
                images = images.cuda(non_blocking=True)
                labels = labels.cuda(non_blocking=True)
                loss = criterion(model(images), labels)
                loss.backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # a batch bound from next() in a loop over step numbers
            """
            import torch
            device = torch.device("cuda")
            data_iter = iter(loader)
            for step in range(1000):
                x = next(data_iter)
                x = x.to(device)
                model(x).sum().backward()
            """,
            line=6,
            fixed="""
            import torch
            device = torch.device("cuda")
            data_iter = iter(loader)
            for step in range(1000):
                x = next(data_iter)
                x = x.to(device, non_blocking=True)
                model(x).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the batch reshaped and split on the host, each part copied (DeepSDF)
            """
            import torch
            for data, idx in loader:
                gt = data.reshape(-1, 4)[:, 3].unsqueeze(1)
                gt = torch.chunk(gt, 4)
                for i in range(4):
                    (model(idx) - gt[i].cuda()).abs().mean().backward()
            """,
            line=6,
            fixed="""
            import torch
            for data, idx in loader:
                gt = data.reshape(-1, 4)[:, 3].unsqueeze(1)
                gt = torch.chunk(gt, 4)
                for i in range(4):
                    (model(idx) - gt[i].cuda(non_blocking=True)).abs().mean().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # a comprehension over the batch drawn in place (partial-conv inpainting)
            """
            import torch
            device = torch.device("cuda")
            batches = iter(loader)
            for i in range(1000):
                image, mask = [x.to(device) for x in next(batches)]
                model(image, mask).sum().backward()
            """,
            line=5,
            fixed="""
            import torch
            device = torch.device("cuda")
            batches = iter(loader)
            for i in range(1000):
                image, mask = [x.to(device, non_blocking=True) for x in next(batches)]
                model(image, mask).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the loader iterator's own `.next()` of torch before 1.x (CDAN)
            """
            import torch
            source = iter(loader)
            for i in range(1000):
                inputs, labels = source.next()
                inputs, labels = inputs.cuda(), labels.cuda()
                criterion(model(inputs), labels).backward()
            """,
            line=5,
            message_contains="2 copies",
            fixed="""
            import torch
            source = iter(loader)
            for i in range(1000):
                inputs, labels = source.next()
                inputs, labels = inputs.cuda(non_blocking=True), labels.cuda(non_blocking=True)
                criterion(model(inputs), labels).backward()
            """,
            unsafe=True,
        ),
        Invalid(  # batches drawn with next() from a generator that re-iterates the loader
            """
            import torch

            def cycle(dl):
                while True:
                    yield from dl

            device = torch.device("cuda")
            looper = cycle(loader)
            for step in range(1000):
                x = next(looper).to(device)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
            line=10,
            fixed="""
            import torch

            def cycle(dl):
                while True:
                    yield from dl

            device = torch.device("cuda")
            looper = cycle(loader)
            for step in range(1000):
                x = next(looper).to(device, non_blocking=True)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
            unsafe=True,
        ),
        Invalid(  # the backward runs in code no one can resolve; the optimizer is zeroed and
            # stepped here (stylegan2-ada's `loss.accumulate_gradients(...)` of a config class)
            """
            import torch
            device = torch.device("cuda")
            data_iter = iter(torch.utils.data.DataLoader(dataset, batch_size=32))
            while True:
                x = next(data_iter)
                x = x.to(device)
                opt.zero_grad(set_to_none=True)
                loss.accumulate_gradients(x)
                opt.step()
            """,
            line=6,
            fixed="""
            import torch
            device = torch.device("cuda")
            data_iter = iter(torch.utils.data.DataLoader(dataset, batch_size=32))
            while True:
                x = next(data_iter)
                x = x.to(device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss.accumulate_gradients(x)
                opt.step()
            """,
            unsafe=True,
        ),
        # Every copy of the loop in one fix, reported once.
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            for imgs, targets in train_loader:
                imgs = imgs.to(device).float() / 255
                loss = compute_loss(model(imgs), targets.to(device))
                loss.backward()
            """,
            line=4,
            message_contains="2 copies in this loop",
            fixed="""
            import torch
            device = torch.device("cuda")
            for imgs, targets in train_loader:
                imgs = imgs.to(device, non_blocking=True).float() / 255
                loss = compute_loss(model(imgs), targets.to(device, non_blocking=True))
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # batches pulled with next() in a `while` loop, copied in a comprehension (minGPT)
            """
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            data_iter = iter(train_loader)
            while True:
                try:
                    batch = next(data_iter)
                except StopIteration:
                    data_iter = iter(train_loader)
                    batch = next(data_iter)
                x, y = [t.to(device) for t in batch]
                model(x, y).backward()
            """,
            line=10,
            fixed="""
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            data_iter = iter(train_loader)
            while True:
                try:
                    batch = next(data_iter)
                except StopIteration:
                    data_iter = iter(train_loader)
                    batch = next(data_iter)
                x, y = [t.to(device, non_blocking=True) for t in batch]
                model(x, y).backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the legacy typed-tensor copy (PyTorch-GAN)
            """
            import torch
            cuda = True if torch.cuda.is_available() else False
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for i, (imgs, _) in enumerate(dataloader):
                real_imgs = Variable(imgs.type(Tensor))
                loss = adversarial_loss(discriminator(real_imgs), valid)
                loss.backward()
            """,
            line=5,
            fixed="""
            import torch
            cuda = True if torch.cuda.is_available() else False
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for i, (imgs, _) in enumerate(dataloader):
                real_imgs = Variable(imgs.type(Tensor, non_blocking=True))
                loss = adversarial_loss(discriminator(real_imgs), valid)
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the batch wrapped in the legacy Variable, then copied (pytorch-vdsr)
            """
            import torch
            from torch.autograd import Variable
            def train(training_data_loader, model, cuda):
                for iteration, batch in enumerate(training_data_loader, 1):
                    input, target = Variable(batch[0]), Variable(batch[1], requires_grad=False)
                    if cuda:
                        input = input.cuda()
                    loss = criterion(model(input), target)
                    loss.backward()
            """,
            line=7,
            fixed="""
            import torch
            from torch.autograd import Variable
            def train(training_data_loader, model, cuda):
                for iteration, batch in enumerate(training_data_loader, 1):
                    input, target = Variable(batch[0]), Variable(batch[1], requires_grad=False)
                    if cuda:
                        input = input.cuda(non_blocking=True)
                    loss = criterion(model(input), target)
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # only the label is read on the host later: the data's copy can overlap (dgcnn)
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for data, label in train_loader:
                data, label = data.to(device), label.to(device).squeeze()
                loss = criterion(model(data), label)
                loss.backward()
                train_true.append(label.cpu().numpy())
            """,
            line=4,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for data, label in train_loader:
                data, label = data.to(device, non_blocking=True), label.to(device).squeeze()
                loss = criterion(model(data), label)
                loss.backward()
                train_true.append(label.cpu().numpy())
            """,
            unsafe=True,
        ),
        Invalid(  # a dict batch copied key by key in a helper the loop calls (monodepth2)
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def process_batch(inputs):
                for key, ipt in inputs.items():
                    inputs[key] = ipt.to(device)
                return model(inputs["image"]).sum()
            for inputs in train_loader:
                loss = process_batch(inputs)
                loss.backward()
            """,
            line=5,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def process_batch(inputs):
                for key, ipt in inputs.items():
                    inputs[key] = ipt.to(device, non_blocking=True)
                return model(inputs["image"]).sum()
            for inputs in train_loader:
                loss = process_batch(inputs)
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the batch wrapped in Variable and copied in one expression (pytorch-wgan)
            """
            import torch
            from torch.autograd import Variable
            def train(self, train_loader):
                for i, (images, _) in enumerate(train_loader):
                    if self.cuda:
                        images = Variable(images).cuda(self.cuda_index)
                    loss = self.D(images).mean()
                    loss.backward()
            """,
            line=6,
            fixed="""
            import torch
            from torch.autograd import Variable
            def train(self, train_loader):
                for i, (images, _) in enumerate(train_loader):
                    if self.cuda:
                        images = Variable(images).cuda(self.cuda_index, non_blocking=True)
                    loss = self.D(images).mean()
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # torchtext in the program, but this loop's batches are a DataLoader's tuples
            """
            import torch
            from torchtext.data import BucketIterator
            text_iter = BucketIterator(text_data, batch_size=32)
            for x, y in image_loader:
                x, y = x.cuda(), y.cuda()
                loss = criterion(model(x), y)
                loss.backward()
            """,
            line=5,
            fixed="""
            import torch
            from torchtext.data import BucketIterator
            text_iter = BucketIterator(text_data, batch_size=32)
            for x, y in image_loader:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                loss = criterion(model(x), y)
                loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # a batch reshaped on the host, then copied (yunjey/pytorch-tutorial GAN)
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for i, (images, _) in enumerate(data_loader):
                images = images.reshape(batch_size, -1).to(device)
                d_loss = criterion(D(images), real_labels)
                d_loss.backward()
            """,
            line=4,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for i, (images, _) in enumerate(data_loader):
                images = images.reshape(batch_size, -1).to(device, non_blocking=True)
                d_loss = criterion(D(images), real_labels)
                d_loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(  # the device chosen by torch.accelerator and passed in as a parameter
            """
            import torch
            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    data, target = data.to(device), target.to(device)
                    loss = F.nll_loss(model(data), target)
                    loss.backward()
            def main():
                device = torch.accelerator.current_accelerator()
            """,
            line=4,
            fixed="""
            import torch
            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
                    loss = F.nll_loss(model(data), target)
                    loss.backward()
            def main():
                device = torch.accelerator.current_accelerator()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for epoch in range(10):
                for inputs, labels in train_loader:
                    inputs, labels = inputs.to(device), labels.to(device)
                    loss = criterion(model(inputs), labels)
                    loss.backward()
            """,
            line=5,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for epoch in range(10):
                for inputs, labels in train_loader:
                    inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                    loss = criterion(model(inputs), labels)
                    loss.backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                for i, batch in enumerate(loader):
                    out = model(batch["x"].to("cuda"))
            """,
            line=5,
            fixed="""
            import torch
            def evaluate(model, loader):
                model.eval()
                for i, batch in enumerate(loader):
                    out = model(batch["x"].to("cuda", non_blocking=True))
            """,
            unsafe=True,
        ),
        Invalid(  # a dict batch copied in a comprehension (siren)
            """
            import torch
            def train(model, loader, optimizer):
                for batch in loader:
                    batch = {k: v.cuda() for k, v in batch.items()}
                    model(**batch).loss.backward()
                    optimizer.step()
            """,
            line=4,
            fixed="""
            import torch
            def train(model, loader, optimizer):
                for batch in loader:
                    batch = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
                    model(**batch).loss.backward()
                    optimizer.step()
            """,
            unsafe=True,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if not self.context.program.gpu_path or library_places_batches(self):
            return
        groups = self._blocking_transfers()
        if groups and is_hogwild(self):
            return
        reported = {id(loop) for loop, _ in groups}
        for loop in data_loops(self):
            if id(loop) not in reported and self.facts.is_training_loop(loop):
                self._copied_by_a_callee(loop)
        for loop, calls in groups:
            # One fix for all of a loop's copies: applied whole or (when another rule's fix
            # overlaps one copy) not at all this pass, so a rewrite never leaves the loop half
            # done, which the next pass would take for the author's choice.
            proven = batch_of_tensors(self, loop)
            if not proven and own_to_classes(self):
                continue  # the batch may be the project's own class, whose .to() is not torch's
            fix = Fix(
                replacements={c: with_keyword(c, "non_blocking", cst.Name("True")) for c in calls},
                description="non_blocking=True",
                safety=None if proven else FixSafety.UNSAFE,
            )
            more = f" ({len(calls)} copies in this loop)" if len(calls) > 1 else ""
            if not proven:
                more += f"; unsafe fix: {_UNPROVEN}"
            self.report(calls[0], self.message + more, fix=fix)

    def _copied_by_a_callee(self, loop: cst.For | cst.While) -> None:
        """The loop hands its batch to the project's code, which copies it to the device
        with a blocking `.to()` (KAIR's `model.feed_data(train_data)`, SPADE's trainer step):
        reported at the call, without a fix (the copy is in another function or module)."""
        if batch_transfers(self, loop) or own_to_classes(self):
            return  # the loop copies (and chooses) itself; or `.to()` may be the project's own
        names = batch_names(loop)
        program = self.context.program
        for call in calls_in(loop.body, into_scopes=False):
            if not any(root_name(a.value) in names for a in call.args):
                continue
            for handed, roles in program.argument_roles(call):
                if (
                    root_name(handed.value) in names
                    and "copied_to_device" in roles
                    and "copied_to_device_non_blocking" not in roles
                ):
                    self.report(
                        call,
                        f"{self.message} (the batch is copied inside `{code_of(call.func)}`, "
                        "in the project's code: pass non_blocking=True there)",
                    )
                    return

    def _torchtext_batches(self, loop: cst.For | cst.While) -> bool:
        """`loop` reads its batch's fields as attributes (`src, len_src = batch.src`) in a
        program that builds torchtext iterators (`BucketIterator.splits(...)` here or in a
        module it imports): the batches are torchtext's, not a DataLoader's (no pinned memory
        to copy from; `BucketIterator(device=...)` already puts them on the device)."""
        if not isinstance(loop, cst.For):
            return False
        targets = names_in(loop.target)
        fields = any(
            isinstance(n.value, cst.Name)
            and n.value.value in targets
            and not isinstance(self.parent(n), cst.Call)
            for n in nodes_of_type(loop.body, cst.Attribute, into_scopes=False)
        )
        return fields and self.context.program.reaches_text_that_says(_builds_torchtext_iterators)

    def _blocking_transfers(self) -> list[tuple[cst.For | cst.While, list[cst.Call]]]:
        """Per batch loop, the copies of batches to the device that do not pass `non_blocking`;
        none for a loop where some copy already passes it (the author chose which overlap)."""
        groups: list[tuple[cst.For | cst.While, list[cst.Call]]] = []
        seen: set[int] = set()
        loops = data_loops(self)
        found_in: dict[int, list[cst.Call]] = {}  # each loop's copies, found once

        def copies_of(loop: cst.For | cst.While) -> list[cst.Call]:
            if id(loop) not in found_in:
                found_in[id(loop)] = batch_transfers(self, loop)
            return found_in[id(loop)]

        # The training loop's copies already choose (`non_blocking=True`): the evaluation
        # loops' blocking copies are the author's choice too (an unpinned held-out loader).
        chosen = any(
            arg(c, "non_blocking") is not None
            for loop in loops
            if self.facts.is_training_loop(loop)
            for c in copies_of(loop)
        )
        for loop in loops:
            if chosen and not self.facts.is_training_loop(loop):
                continue
            if self._torchtext_batches(loop):
                continue  # torchtext's iterator makes the batch (unpinned, or on the device)
            copies = [c for c in copies_of(loop) if id(c) not in seen]
            seen |= {id(c) for c in copies}
            # `.cuda(gpu, non_blocking=True)` counts as the author's choice too
            if any(arg(c, "non_blocking") is not None for c in copies):
                continue
            transfers = [c for c in copies if method_name(c) in ("to", "type", "cuda")]
            found = [
                c
                for c in transfers
                if not read_on_host_later(self, c) and not prefetcher_fallback(self, c)
            ]
            if found:
                groups.append((loop, found))
        return groups
